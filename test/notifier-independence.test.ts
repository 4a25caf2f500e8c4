// Email does not wait for webhooks: with the whole stack running and the customer's webhook
// receiver never answering, the owner's emails still go out while every delivery is stuck.
// (test/notifier.test.ts runs without any dispatcher at all.)
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import { startDeliveryStack, waitUntil, type DeliveryStack } from "./helpers/delivery-stack";
import { startHttpsReceiver, type HttpsReceiver } from "./helpers/https-receiver";
import { startSmtpServer, type TestSmtpServer } from "./helpers/smtp-server";
import { testDatabases } from "./helpers/services";
import { startStack, type Stack } from "./helpers/stack";
import type { OutboxEntry } from "../services/notifier.service";

describe.each(testDatabases())("email independent of webhook delivery on %s", database => {
	let smtp: TestSmtpServer;
	let receiver: HttpsReceiver;
	let delivery: DeliveryStack;

	beforeAll(async () => {
		smtp = await startSmtpServer();
		receiver = await startHttpsReceiver();
		delivery = await startDeliveryStack(database, {
			receiver,
			env: { SMTP_URL: smtp.url, MAIL_POLL_INTERVAL: "100ms", DELIVERY_TIMEOUT: "120s", DELIVERY_LEASE: "180s" },
		});
	});

	afterAll(async () => {
		// Closing the receiver first ends the hanging requests, so the dispatcher stops promptly.
		await receiver?.close();
		await delivery?.stop();
		await smtp?.close();
	});

	it("emails the opted-in owner while the webhook receiver hangs on every delivery", async () => {
		const { stack } = delivery;
		const token = await stack.token("alice", { email: "alice@example.com", name: "Alice" });
		const webhook = await delivery.createWebhook(token);
		delivery.script(webhook, [], { hang: true });
		const settings = await stack.request("PUT", "/id/v3/user/settings", {
			token,
			body: { notifications: [{ category: "tasking", settings: [{ topic: "tasking:order_status", email: true }] }] },
		});
		expect(settings.status).toBe(200);

		const eventIds: string[] = ["fulfilled", "failed", "expired"].map(() => crypto.randomUUID());
		for (const [index, eventId] of eventIds.entries()) {
			await stack.app.broker.emit("tasking.order_status", {
				event_id: eventId,
				customer_id: "~alice",
				user_id: "alice",
				order_id: `ord-${index}`,
				status: ["fulfilled", "failed", "expired"][index],
			});
		}

		// The dispatcher is stuck on the receiver…
		await receiver.waitFor(1, 30_000);
		// …and the emails go out all the same.
		const sent = await waitUntil(
			async () => ((await stack.app.broker.call("notifier.outbox", { status: "sent" })) as OutboxEntry[]).filter(entry => eventIds.includes(entry.event_id ?? "")),
			entries => entries.length === eventIds.length,
			"three sent emails",
		);
		const messageIds = new Set(sent.map(entry => entry.message_id));
		expect(smtp.received.filter(mail => messageIds.has(mail.messageId))).toHaveLength(3);

		// At that moment no delivery has succeeded: the receiver has not answered once.
		const deliveries = await stack.request("GET", `/id/v3/webhooks/${webhook.id}/deliveries`, { token });
		expect(deliveries.status).toBe(200);
		expect(deliveries.body.deliveries.length).toBeGreaterThan(0);
		expect(deliveries.body.deliveries.map((entry: { status: string }) => entry.status)).toEqual(["pending", "pending", "pending"]);
	});
});

describe("email while the users service is away", () => {
	let stack: Stack;
	beforeAll(async () => {
		// A notifier whose node has no users service (not started yet, or not yet discovered).
		stack = await startStack({ services: ["notifier"], env: { MAIL_POLL_INTERVAL: "100ms" } });
	});
	afterAll(() => stack?.stop());

	it("waits without spending its attempts, instead of counting the outage against the email", async () => {
		const event = { event_id: crypto.randomUUID(), user_id: "away-user", order_id: "o-away", status: "fulfilled" };
		await stack.app.broker.emit("tasking.order_status", event);
		const entry = await waitUntil(
			async () => ((await stack.app.broker.call("notifier.outbox", { limit: 50 })) as OutboxEntry[]).find(row => row.event_id === event.event_id),
			row => Boolean(row?.last_error?.startsWith("the users service did not answer")),
			"the email to find the users service away",
		);
		// Polled again and again meanwhile: still pending, with no attempt spent.
		await sleep(2_500);
		const later = ((await stack.app.broker.call("notifier.outbox", { limit: 50 })) as OutboxEntry[]).find(row => row.event_id === event.event_id)!;
		expect(entry!.status).toBe("pending");
		expect(later).toMatchObject({ status: "pending", attempts: 0 });
	});
});
