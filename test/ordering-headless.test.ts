// A queue left with waiting deliveries and no head (API.md, "Ordering per order"): on PostgreSQL a
// head can end in a transaction that did not see a status committed beside it by another
// instance, and the instance that took that status in checks only after publish has answered, or
// never if it dies first (the cluster ordering tests met both: orders arrived 0,1,3,2,4 and
// 0,1,2,4,3). The next status taken in must not become the head and overtake the one waiting:
// it waits too, and the earliest waiting one goes first. Without a sweep in sight (the poll loop
// runs hourly here), so that nothing but intake can set the queue going.
import { testDatabases } from "./helpers/services";
import { newCustomer, orderEvent, startDeliveryStack, verified, waitUntil, type DeliveryStack } from "./helpers/delivery-stack";

describe.each(testDatabases())("a queue without a head on %s", database => {
	let env: DeliveryStack;
	beforeAll(async () => {
		env = await startDeliveryStack(database, { env: { DELIVERY_POLL_INTERVAL: "1h" } });
	});
	afterAll(() => env?.stop());

	it("a newer status taken in waits behind the waiting ones, and the earliest goes first", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const order = `order-headless-${database}`;
		const base = Date.parse("2026-07-01T00:00:00Z");
		const status = (label: string, step: number, value: "committed" | "staged" | "in progress") =>
			orderEvent(alice, { order_id: order, order_name: label, status: value, occurred_at: new Date(base + step * 1_000).toISOString() });
		const [h1, h2, h3] = [status("H1", 0, "committed"), status("H2", 1, "staged"), status("H3", 2, "in progress")];
		env.script(webhook, [], request => ({ status: verified(request, webhook.secret).data.order_name === "H1" ? 500 : 200 }));
		const publish = (event: typeof h1) => env.stack.app.broker.call("dispatcher.publish", event);
		const rowOf = (eventId: string) => env.stack.db("deliveries").where({ event_id: eventId, webhook_id: webhook.id }).first();

		await publish(h1);
		await publish(h2);
		await waitUntil(() => rowOf(h1.event_id!), row => row?.attempt_count === 1 && row.lease_id === null, "H1's first attempt to be written");
		expect(Boolean((await rowOf(h2.event_id!)).waiting)).toBe(true);
		// The state a race and a crash leave: the head ended and nothing promoted H2.
		const ended = await env.stack.db("deliveries").where({ event_id: h1.event_id, webhook_id: webhook.id, status: "pending" }).whereNull("lease_id").update({ status: "succeeded", next_attempt_at: null });
		expect(ended).toBe(1);

		await publish(h3);
		await waitUntil(() => Promise.all([rowOf(h2.event_id!), rowOf(h3.event_id!)]), rows => rows.every(row => row.status === "succeeded"), "H2 and H3 to be delivered");
		const answered = env
			.received(webhook)
			.filter(request => request.answeredStatus === 200)
			.map(request => verified(request, webhook.secret).data.order_name);
		expect(answered).toEqual(["H2", "H3"]);
	});
});
