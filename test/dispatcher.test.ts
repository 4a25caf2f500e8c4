// The dispatcher end to end: events in, signed HTTPS deliveries out to a real receiver, retries
// on the persisted schedule, cancellation and parking, rejected events, and the delivery log
// through the real gateway. On SQLite and PostgreSQL.
import crypto from "node:crypto";
import { expectProblem } from "./helpers/stack";
import { testDatabases } from "./helpers/services";
import { sleep, startDeliveryStack, verified, waitUntil, type CreatedWebhook, type DeliveryStack, type OrderEvent } from "./helpers/delivery-stack";
import { verifyDelivery } from "./helpers/https-receiver";

const TOPIC = "tasking:order_status";
const OTHER_TOPIC = "imaging:capture_ready";
const RETRY_OFFSETS_MS = [1_000, 2_000, 3_000, 4_000, 5_000];

describe.each(testDatabases())("dispatcher on %s", database => {
	let env: DeliveryStack;

	const db = () => env.stack.db;
	const publish = (event: OrderEvent) => env.stack.app.broker.call("dispatcher.publish", event) as Promise<{ event_id: string; duplicate: boolean; deliveries: number }>;
	const emit = (event: unknown) => env.stack.app.broker.emit("tasking.order_status", event);
	/** A fresh customer per test keeps the tests' webhooks apart; its user is known to `users`. */
	const newCustomer = async () => {
		const id = `cust-${crypto.randomBytes(4).toString("hex")}`;
		const userId = `user-${id}`;
		const token = await env.stack.token(userId, { customer: id });
		await env.stack.request("GET", "/id/v3/user/details", { token });
		return { id, userId, token };
	};
	const order = (customer: { id: string; userId: string }, extra: Partial<OrderEvent> = {}): OrderEvent => ({
		event_id: crypto.randomUUID(),
		customer_id: customer.id,
		user_id: customer.userId,
		order_id: `order-${crypto.randomBytes(4).toString("hex")}`,
		status: "fulfilled",
		...extra,
	});
	const deliveryOf = async (eventId: string, webhook: CreatedWebhook) => db()("deliveries").where({ event_id: eventId, webhook_id: webhook.id }).first();
	const waitForStatus = (eventId: string, webhook: CreatedWebhook, status: string) =>
		waitUntil(() => deliveryOf(eventId, webhook), row => row?.status === status, `delivery of ${eventId} to be ${status}`);
	const countRows = async (table: string) => Number((await db()(table).count({ count: "*" }))[0].count);

	beforeAll(async () => {
		env = await startDeliveryStack(database, { env: { SECRET_ROTATION_GRACE: "3s" } });
		await env.stack.app.broker.call("topics.register", { topic: OTHER_TOPIC, category: "imaging", name: "Capture ready", description: "A capture is ready" });
	});
	afterAll(() => env?.stop());

	it("fans an event out to every active subscribed webhook of its customer only, signed, with the exact body", async () => {
		const alice = await newCustomer();
		const bob = await newCustomer();
		const first = await env.createWebhook(alice.token);
		const second = await env.createWebhook(alice.token);
		const inactive = await env.createWebhook(alice.token);
		const unsubscribed = await env.createWebhook(alice.token, { events: [OTHER_TOPIC] });
		const otherCustomer = await env.createWebhook(bob.token);
		expect((await env.stack.request("PATCH", `/id/v3/webhooks/${inactive.id}`, { token: alice.token, body: { active: false } })).status).toBe(200);

		const event = order(alice, {
			status: "Fulfilled",
			previous_status: "in progress",
			order_name: "Harbour survey",
			occurred_at: "2026-03-01T12:00:00+02:00",
			details: { status: "overridden?", resolution_m: 0.5, tags: ["a", "b"] },
		});
		const answer = await publish(event);
		expect(answer).toEqual({ event_id: event.event_id, duplicate: false, deliveries: 2 });

		// Persisted before any request: exactly one delivery per active subscribed webhook.
		const rows = await db()("deliveries").where({ event_id: event.event_id });
		expect(rows.map(row => row.webhook_id).sort()).toEqual([first.id, second.id].sort());

		for (const webhook of [first, second]) {
			await waitForStatus(event.event_id!, webhook, "succeeded");
			const [request] = env.received(webhook);
			const delivery = rows.find(row => row.webhook_id === webhook.id);
			expect(request.method).toBe("POST");
			expect(request.headers["content-type"]).toBe("application/json");
			expect(request.headers["user-agent"]).toMatch(/satellite-webhooks/);
			expect(request.headers["webhook-id"]).toBe(`msg_${delivery.id}`);
			const payload = verified(request, webhook.secret);
			expect(payload).toEqual({
				type: TOPIC,
				timestamp: "2026-03-01T10:00:00.000Z",
				data: {
					order_id: event.order_id,
					status: "fulfilled",
					previous_status: "in progress",
					user_id: alice.userId,
					order_name: "Harbour survey",
					resolution_m: 0.5,
					tags: ["a", "b"],
				},
			});
			// Exactly the stored bytes were sent and signed.
			const message = await db()("delivery_messages").where({ event_id: event.event_id }).first();
			expect(request.body).toBe(message.body);
		}
		await sleep(300);
		for (const webhook of [inactive, unsubscribed, otherCustomer]) expect(env.received(webhook)).toHaveLength(0);

		// The other customer's event reaches only the other customer's webhook.
		const acmeEvent = order(bob);
		expect(await publish(acmeEvent)).toMatchObject({ deliveries: 1 });
		await waitForStatus(acmeEvent.event_id!, otherCustomer, "succeeded");
		expect(verified(env.received(otherCustomer)[0], otherCustomer.secret)).toMatchObject({ data: { order_id: acmeEvent.order_id } });
		expect(env.received(first)).toHaveLength(1);
		expect(env.received(second)).toHaveLength(1);
	});

	it("looks the customer up from user_id when customer_id is absent", async () => {
		const bob = await newCustomer();
		const webhook = await env.createWebhook(bob.token);
		const { customer_id: _ignored, ...event } = order(bob);
		expect(await publish(event as OrderEvent)).toMatchObject({ deliveries: 1 });
		await waitForStatus(event.event_id!, webhook, "succeeded");
	});

	it("delivers the same event_id once per webhook, however often and however it arrives", async () => {
		const alice = await newCustomer();
		const one = await env.createWebhook(alice.token);
		const two = await env.createWebhook(alice.token);
		const event = order(alice);
		const [firstAnswer] = await Promise.all([publish(event), emit(event), emit(event)]);
		const again = await publish({ ...event, status: "failed" });
		expect(again).toEqual({ event_id: event.event_id, duplicate: true, deliveries: 0 });
		expect(firstAnswer.event_id).toBe(event.event_id);
		for (const webhook of [one, two]) await waitForStatus(event.event_id!, webhook, "succeeded");
		await sleep(300);
		expect(Number((await db()("deliveries").where({ event_id: event.event_id }).count({ count: "*" }))[0].count)).toBe(2);
		expect(env.received(one)).toHaveLength(1);
		expect(env.received(two)).toHaveLength(1);
		expect(verified(env.received(one)[0], one.secret)).toMatchObject({ data: { status: "fulfilled" } });
	});

	it("generates an event_id when the producer sends none", async () => {
		const alice = await newCustomer();
		const webhook = await env.createWebhook(alice.token);
		const { event_id: _none, ...event } = order(alice);
		const answer = await publish(event as OrderEvent);
		expect(answer.event_id).toMatch(/^[0-9a-f-]{36}$/);
		await waitForStatus(answer.event_id, webhook, "succeeded");
	});
});
