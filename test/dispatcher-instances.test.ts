// Two dispatcher instances (two brokers) on the same database: claims are leases in the database,
// so no delivery is ever attempted by both at the same time, and none is lost. On SQLite the two
// share the single writer; on PostgreSQL they claim with FOR UPDATE SKIP LOCKED.
import crypto from "node:crypto";
import { testDatabases } from "./helpers/services";
import { attemptsMadeBy, sleep, useTwoDispatchers, verified, waitUntil } from "./helpers/delivery-stack";
import type { ReceivedRequest } from "./helpers/https-receiver";

// Small capacity, so that most deliveries are not leased at intake but claimed by the poll loops
// of both instances, and every delivery goes through one retry (first answer 500).
const INSTANCE_ENV = { DELIVERY_CONCURRENCY: "4", DELIVERY_WEBHOOK_CONCURRENCY: "2" };
const WEBHOOKS = 4;
const EVENTS = 40;


describe.each(testDatabases())("two dispatcher instances on %s", database => {
	const instances = useTwoDispatchers(database, INSTANCE_ENV);

	it("never attempts one delivery twice at once, and delivers every one", async () => {
		const { first, second } = instances;
		const token = await first.stack.token("alice");
		const webhooks = [];
		for (let i = 0; i < WEBHOOKS; i++) webhooks.push(await first.createWebhook(token));

		const inFlight = new Map<string, number>();
		const seen = new Map<string, number>();
		let overlaps = 0;
		const answer = async (request: ReceivedRequest) => {
			const id = String(request.headers["webhook-id"]);
			const now = (inFlight.get(id) ?? 0) + 1;
			inFlight.set(id, now);
			if (now > 1) overlaps += 1;
			seen.set(id, (seen.get(id) ?? 0) + 1);
			const attempt = seen.get(id)!;
			await sleep(15);
			inFlight.set(id, inFlight.get(id)! - 1);
			return { status: attempt === 1 ? 500 : 200 };
		};
		for (const webhook of webhooks) first.script(webhook, [], answer);

		const eventIds: string[] = [];
		for (let i = 0; i < EVENTS; i++) {
			const eventId = crypto.randomUUID();
			eventIds.push(eventId);
			first.stack.app.broker.emit("tasking.order_status", { event_id: eventId, customer_id: "~alice", user_id: "alice", order_id: `o-${i}`, status: "committed" });
		}
		const total = EVENTS * WEBHOOKS;
		const succeeded = () => first.stack.db("deliveries").whereIn("event_id", eventIds).andWhere({ status: "succeeded" }).count({ count: "*" });
		await waitUntil(succeeded, ([{ count }]) => Number(count) === total, "every delivery to succeed", 60_000);

		const rows = await first.stack.db("deliveries").whereIn("event_id", eventIds);
		expect(rows).toHaveLength(total);
		expect(rows.every(row => row.attempt_count === 2 && row.lease_id === null)).toBe(true);
		expect(overlaps).toBe(0);
		// Each delivery reached the receiver exactly twice (the 500 and the 200): none lost, none doubled.
		const requests = webhooks.flatMap(webhook => first.received(webhook));
		expect(requests).toHaveLength(total * 2);
		expect(new Set(requests.map(request => request.headers["webhook-id"]))).toEqual(new Set(rows.map(row => `msg_${row.id}`)));
		for (const webhook of webhooks) for (const request of first.received(webhook)) verified(request, webhook.secret);
		const attempts = await first.stack.db("delivery_attempt_log").whereIn("delivery_id", rows.map(row => row.id));
		expect(attempts).toHaveLength(total * 2);

		// Both instances did part of the work.
		const [byFirst, bySecond] = await Promise.all([attemptsMadeBy(first.stack.app.broker), attemptsMadeBy(second.app.broker)]);
		expect(byFirst).toBeGreaterThan(0);
		expect(bySecond).toBeGreaterThan(0);
		expect(byFirst + bySecond).toBe(total * 2);
	});
});
