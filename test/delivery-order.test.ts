// A webhook's deliveries are first attempted in the order their events came in, also when intake
// had to leave some of them in the database: a webhook at its share of leases gets no new lease
// at intake until a claim has taken the rows it left there. Before, once the webhook had a few
// leases free again, newer events were leased at intake and sent while the older rows waited for
// a claim (in the delivery benchmark, 1-2 % of the first seconds' deliveries arrived 0.6-1.1 s late).
import { WEBHOOK_LEASE_FACTOR } from "../mixins/dispatcher/shared";
import { testDatabases } from "./helpers/services";
import { newCustomer, orderEvent, startDeliveryStack, verified, waitUntil, type DeliveryStack } from "./helpers/delivery-stack";

describe.each(testDatabases())("delivery order within a webhook, on %s", database => {
	let env: DeliveryStack;
	// One attempt at a time per webhook, so the receiver sees the order the attempts started in.
	const SHARE = 1 * WEBHOOK_LEASE_FACTOR;

	beforeAll(async () => {
		env = await startDeliveryStack(database, { env: { DELIVERY_WEBHOOK_CONCURRENCY: "1", DELIVERY_POLL_INTERVAL: "1h" } });
	});
	afterAll(() => env?.stop());

	it("rows intake left for a claim are not overtaken by newer events of the same webhook", async () => {
		const owner = await newCustomer(env.stack);
		const webhook = await env.createWebhook(owner.token);
		env.script(webhook, [], { status: 200, delayMs: 40 });
		const publish = (sequence: number) => env.stack.app.broker.call("dispatcher.publish", orderEvent(owner, { order_id: `order-${String(sequence).padStart(4, "0")}` }));

		// More than the webhook's share: the rest wait in the database for a claim.
		const FIRST = SHARE + 24;
		for (let i = 0; i < FIRST; i++) await publish(i);
		// A few leases are free again, far from half the share: newer events now find room.
		await waitUntil(() => env.received(webhook).length, count => count >= 4, "the first attempts");
		const SECOND = 20;
		for (let i = FIRST; i < FIRST + SECOND; i++) await publish(i);

		const received = await waitUntil(() => env.received(webhook), requests => requests.length >= FIRST + SECOND, "every delivery");
		const order = received.map(request => verified(request, webhook.secret).data.order_id as string);
		const overtaken = order.filter((id, i) => order.slice(i + 1).some(later => later < id)).length;
		console.log(JSON.stringify({ database, sent: FIRST + SECOND, received: received.length, overtaken }));
		expect(new Set(order).size).toBe(FIRST + SECOND);
		expect(overtaken).toBe(0);
	});
});
