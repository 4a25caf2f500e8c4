// The dispatcher's sender threads (lib/threaded-sender.ts) against a real HTTPS receiver: the same
// signed requests and outcomes as the in-process sender, batches of attempts spread over several
// threads, rate-limited attempts past their deadline, a start that fails on a bad CA file,
// attempts held by a thread that dies, and a close that lets attempts in flight finish.
import type { Worker } from "node:worker_threads";
import { generateWebhookSecret } from "../lib/crypto";
import { ThreadedWebhookSender } from "../lib/threaded-sender";
import type { DeliveryRequest } from "../lib/webhook-sender";
import { startHttpsReceiver, verifyDelivery, type HttpsReceiver } from "./helpers/https-receiver";
import { metricTotal, newCustomer, orderEvent, startDeliveryStack, verified, waitUntil } from "./helpers/delivery-stack";

const LOOPBACK = ["127.0.0.0/8", "::1/128"];

describe("ThreadedWebhookSender", () => {
	let receiver: HttpsReceiver;
	let caFile: string;
	const secret = generateWebhookSecret();
	let sequence = 0;
	const open: ThreadedWebhookSender[] = [];

	const attempt = (path = "/hooks/orders", overrides: Partial<DeliveryRequest> = {}): DeliveryRequest => ({
		url: `${receiver.url}${path}`,
		messageId: `msg_${++sequence}`,
		body: JSON.stringify({ type: "tasking:order_status", timestamp: "2026-11-23T10:00:00Z", data: { order_id: `o-${sequence}`, status: "fulfilled" } }),
		secrets: [secret],
		timeoutMs: 5_000,
		...overrides,
	});
	const startSender = async (threads: number) => {
		const sender = new ThreadedWebhookSender({ allowNets: LOOPBACK, caFile, threads });
		open.push(sender);
		await sender.start();
		return sender;
	};
	const workersOf = (sender: ThreadedWebhookSender) => (sender as unknown as { threads: Array<{ worker: Worker | null }> }).threads.map(thread => thread.worker);

	beforeAll(async () => {
		receiver = await startHttpsReceiver();
		caFile = receiver.writeCaFile();
	});
	afterAll(async () => {
		await Promise.all(open.map(sender => sender.close()));
		await receiver.close();
	});
	beforeEach(() => {
		receiver.requests.length = 0;
		receiver.setDefault({ status: 200, body: "ok" });
	});

	it("sends every attempt of a burst from three threads, each signed over the bytes the receiver got", async () => {
		const sender = await startSender(3);
		// Different URLs, so that the attempts spread over the threads.
		const requests = Array.from({ length: 300 }, (_, i) => attempt(`/hooks/${i % 7}`));
		const outcomes = await Promise.all(requests.map(request => sender.send(request)));

		expect(outcomes.every(outcome => outcome.success && outcome.statusCode === 200 && outcome.responseExcerpt === "ok")).toBe(true);
		const received = await receiver.waitFor(300);
		expect(new Set(received.map(request => request.headers["webhook-id"]))).toEqual(new Set(requests.map(request => request.messageId)));
		for (const request of received) expect(verifyDelivery(request, secret)).toBeTruthy();
		// Each URL went to one thread only; the seven URLs used more than one of the three threads.
		expect(workersOf(sender).filter(Boolean)).toHaveLength(3);
	});

	it("reports refusals and HTTP errors as outcomes, as the in-process sender does", async () => {
		const sender = await startSender(1);
		receiver.respondWith({ status: 503, headers: { "retry-after": "7" }, body: "busy" });
		const busy = await sender.send(attempt());
		expect(busy).toMatchObject({ success: false, statusCode: 503, errorKind: "http_status", title: "HTTP Status Error", responseExcerpt: "busy" });
		expect(Date.parse(busy.retryAfter!) - Date.parse(busy.attemptedAt)).toBeGreaterThanOrEqual(6_000);

		const plain = await sender.send(attempt("/x", { url: `http://127.0.0.1:${receiver.port}/x` }));
		expect(plain).toMatchObject({ success: false, errorKind: "blocked", detail: "Only https:// URLs are delivered to" });
		const outside = new ThreadedWebhookSender({ allowNets: [], caFile, threads: 1 });
		open.push(outside);
		expect(await outside.send(attempt())).toMatchObject({ success: false, errorKind: "blocked", title: "Blocked" });
	});

	it("makes a rate-limited attempt only if the thread can start it by its deadline, and sends nothing otherwise", async () => {
		const sender = await startSender(1);
		const late = attempt("/late");
		const timely = attempt("/timely");
		expect(await sender.sendBy(late, Date.now() - 1)).toBeNull();
		expect(await sender.sendBy(timely, Date.now() + 60_000)).toMatchObject({ success: true, statusCode: 200 });
		await receiver.waitFor(1);
		expect(receiver.requests.map(request => request.headers["webhook-id"])).toEqual([timely.messageId]);
	});

	it("fails to start with the sender's own error when the CA file is unreadable, and keeps no thread", async () => {
		const sender = new ThreadedWebhookSender({ allowNets: LOOPBACK, caFile: "/nonexistent/ca.pem", threads: 2 });
		await expect(sender.start()).rejects.toThrow("WEBHOOK_CA_FILE: cannot read /nonexistent/ca.pem");
		await sender.close();
	});

	it("rejects the attempts a dying thread held, and sends the next ones from a new thread", async () => {
		const sender = await startSender(1);
		receiver.setDefault({ status: 200, delayMs: 2_000 });
		const held = [sender.send(attempt()), sender.send(attempt())];
		await receiver.waitFor(2);
		const [first] = workersOf(sender);
		await first!.terminate();
		for (const outcome of await Promise.allSettled(held)) {
			expect(outcome.status).toBe("rejected");
			expect((outcome as PromiseRejectedResult).reason.message).toMatch(/sender thread stopped .* with attempts in flight/);
		}

		receiver.setDefault({ status: 200, body: "ok" });
		expect(await sender.send(attempt())).toMatchObject({ success: true });
		const [second] = workersOf(sender);
		expect(second).not.toBeNull();
		expect(second).not.toBe(first);
	});

	it("lets attempts in flight finish on close, then refuses new ones", async () => {
		const sender = await startSender(2);
		receiver.setDefault({ status: 200, delayMs: 300, body: "late" });
		const inFlight = Promise.all([sender.send(attempt("/a")), sender.send(attempt("/b")), sender.send(attempt("/c"))]);
		await receiver.waitFor(3);
		await sender.close();
		expect((await inFlight).map(outcome => outcome.responseExcerpt)).toEqual(["late", "late", "late"]);
		await expect(sender.send(attempt())).rejects.toThrow("the sender is closed");
		expect(workersOf(sender).every(worker => worker === null)).toBe(true);
	});
});

// The dispatcher as configured: in-process (0), one thread (the default) and several.
describe.each(["0", "1", "3"])("dispatcher with DELIVERY_SENDER_THREADS=%s", threads => {
	it("delivers every event of a burst to each webhook, signed, with the attempts recorded", async () => {
		const env = await startDeliveryStack("sqlite", { env: { DELIVERY_SENDER_THREADS: threads } });
		try {
			const customer = await newCustomer(env.stack);
			const webhooks = [await env.createWebhook(customer.token), await env.createWebhook(customer.token)];
			const events = Array.from({ length: 20 }, () => orderEvent(customer));
			for (const event of events) await env.stack.app.broker.call("dispatcher.publish", event);

			for (const webhook of webhooks) {
				const received = await waitUntil(() => env.received(webhook), requests => requests.length >= events.length, `${events.length} deliveries to ${webhook.path}`);
				expect(received).toHaveLength(events.length);
				expect(new Set(received.map(request => verified(request, webhook.secret).data.order_id))).toEqual(new Set(events.map(event => event.order_id)));
			}
			const page = await waitUntil(
				async () => (await env.stack.request("GET", `/id/v3/webhooks/${webhooks[0].id}/deliveries?per_page=100`, { token: customer.token })).body,
				body => body.deliveries?.length === events.length && body.deliveries.every((item: { status: string }) => item.status === "succeeded"),
				"every delivery recorded as succeeded",
			);
			expect(page.deliveries.every((item: { attempt_count: number; last_status_code: number }) => item.attempt_count === 1 && item.last_status_code === 200)).toBe(true);
			// Every connection the receiver accepted is counted, whichever thread opened it.
			const opened = () => metricTotal(env.stack.app.broker, "webhook_connections_opened_total");
			expect(env.receiver.connections).toBeGreaterThan(0);
			await waitUntil(opened, count => count === env.receiver.connections, "the connections counter to match the receiver");
		} finally {
			await env.stop();
		}
	});
});
