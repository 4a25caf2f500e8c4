// The per-webhook rate limit (API.md `rate_limit`): at most that many deliveries a second reach
// the webhook, counted at the receiver, with two dispatcher instances sharing the database; the
// deliveries over the limit wait, and none fails, spends a retry or is lost. Then the send-time
// bookkeeping of lib/rate-slots.ts on its own.
import crypto from "node:crypto";
import { testDatabases } from "./helpers/services";
import { attemptsMadeBy, useTwoDispatchers, waitUntil } from "./helpers/delivery-stack";
import type { ReceivedRequest } from "./helpers/https-receiver";
import { ClockOffset, RateSlots, SLOT_GRACE_MS, slotsToReserve } from "../lib/rate-slots";

// Large enough that the receiver's own timing noise (it shares the event loop with both instances)
// moves a request across a window's edge far less often than the 10 % margin allows.
const LIMIT = 100;
const EVENTS = 400;

/** The most requests within any one second (a half-open window starting at a request). */
function busiestSecond(requests: ReceivedRequest[]): number {
	const times = requests.map(request => request.receivedAt.getTime()).sort((a, b) => a - b);
	let most = 0;
	for (let start = 0, end = 0; start < times.length; start += 1) {
		while (end < times.length && times[end] < times[start] + 1_000) end += 1;
		most = Math.max(most, end - start);
	}
	return most;
}

describe.each(testDatabases())("a rate-limited webhook with two dispatcher instances on %s", database => {
	// Room for far more than the limit, so that only the limit holds the deliveries back.
	const instances = useTwoDispatchers(database, { DELIVERY_CONCURRENCY: "32", DELIVERY_WEBHOOK_CONCURRENCY: "16" });

	it(`never sends more than ${LIMIT} a second (plus 10 %) in all, and delivers every one without failing it`, async () => {
		const { first, second } = instances;
		const token = await first.stack.token("alice");
		const limited = await first.createWebhook(token, { name: "limited" });
		const unlimited = await first.createWebhook(token, { name: "unlimited" });
		const patched = await first.stack.request("PATCH", `/id/v3/webhooks/${limited.id}`, { token, body: { rate_limit: LIMIT } });
		expect(patched.status).toBe(200);
		expect(patched.body).toMatchObject({ rate_limit: LIMIT });

		const eventIds: string[] = [];
		for (let i = 0; i < EVENTS; i++) {
			const eventId = crypto.randomUUID();
			eventIds.push(eventId);
			// Half through each instance: both take in, lease and send.
			const broker = i % 2 === 0 ? first.stack.app.broker : second.app.broker;
			await broker.call("dispatcher.publish", { event_id: eventId, customer_id: "~alice", user_id: "alice", order_id: `o-${i}`, status: "committed" });
		}
		const succeededOf = (webhookId: string) =>
			first.stack.db("deliveries").whereIn("event_id", eventIds).andWhere({ webhook_id: webhookId, status: "succeeded" }).count({ count: "*" });
		await waitUntil(() => succeededOf(unlimited.id), ([{ count }]) => Number(count) === EVENTS, "the unlimited webhook's deliveries");
		await waitUntil(() => succeededOf(limited.id), ([{ count }]) => Number(count) === EVENTS, "the limited webhook's deliveries", 60_000);

		const received = first.received(limited);
		const busiest = busiestSecond(received);
		console.log(`rate limit ${LIMIT}/s on ${database}: ${received.length} requests, busiest second ${busiest}, unlimited neighbour's busiest second ${busiestSecond(first.received(unlimited))}`);
		expect(busiest).toBeLessThanOrEqual(Math.floor(LIMIT * 1.1));
		// Nothing lost, nothing sent twice, and waiting never counted as an attempt.
		expect(received).toHaveLength(EVENTS);
		expect(new Set(received.map(request => request.headers["webhook-id"])).size).toBe(EVENTS);
		const rows = await first.stack.db("deliveries").whereIn("event_id", eventIds).andWhere({ webhook_id: limited.id });
		expect(rows.every(row => Number(row.attempt_count) === 1)).toBe(true);
		expect(await attemptsMadeBy(first.stack.app.broker, "failed")).toBe(0);
		expect(await attemptsMadeBy(second.app.broker, "failed")).toBe(0);
		// Both instances sent part of it, from the one shared schedule.
		expect(await attemptsMadeBy(first.stack.app.broker)).toBeGreaterThan(0);
		expect(await attemptsMadeBy(second.app.broker)).toBeGreaterThan(0);

		// Cleared, the limit no longer holds anything back (the same check, at 5x the limit's pace).
		const cleared = await first.stack.request("PATCH", `/id/v3/webhooks/${limited.id}`, { token, body: { rate_limit: null } });
		expect(cleared.body).toMatchObject({ rate_limit: null });
	});
});

describe("send times held by one instance", () => {
	it("hands out a reserved slot only once its time has come, each once", () => {
		const slots = new RateSlots();
		expect(slots.needsReservation("w", 10)).toBe(true);
		slots.reserving("w", 10);
		expect(slots.needsReservation("w", 10)).toBe(false);
		slots.reserved("w", 10, 1_000, 3);
		expect(slots.take("w", 10, 999)).toBe(false);
		expect(slots.take("w", 10, 1_000)).toBe(true);
		expect(slots.nextAt("w")).toBe(1_100);
		expect(slots.take("w", 10, 1_050)).toBe(false);
		expect(slots.take("w", 10, 1_100)).toBe(true);
		expect(slots.take("w", 10, 1_200)).toBe(true);
		expect(slots.take("w", 10, 1_300)).toBe(false);
		expect(slots.needsReservation("w", 10)).toBe(true);
	});

	it("drops slots missed by more than the grace instead of sending them late, in a bunch", () => {
		const slots = new RateSlots();
		slots.reserving("w", 100);
		slots.reserved("w", 100, 0, 10);
		// At 150 ms the slots of 0..40 ms are past the grace: the first usable one is 50 ms.
		expect(slots.take("w", 100, 50 + SLOT_GRACE_MS)).toBe(true);
		expect(slots.nextAt("w")).toBe(60);
	});

	it("keeps no slot spaced for a limit that changed while they were reserved", () => {
		const slots = new RateSlots();
		slots.reserving("w", 10);
		slots.reserved("w", 5, 0, 3);
		expect(slots.nextAt("w")).toBeNull();
		slots.forget("w");
		expect(slots.needsReservation("w", 5)).toBe(true);
	});

	it("turns database times into local ones by the quickest answer, not each answer's own delay", () => {
		const clock = new ClockOffset();
		// The database is 1 000 ms ahead; this answer came back 80 ms after the database read its clock.
		expect(clock.toLocal(5_000, { before: 3_990, dbNow: 5_000, after: 4_080 })).toBe(4_080);
		// A quick answer narrows it down, and a slow one later does not move it again.
		expect(clock.toLocal(6_000, { before: 4_999, dbNow: 6_000, after: 5_001 })).toBe(5_001);
		expect(clock.toLocal(7_000, { before: 5_990, dbNow: 7_000, after: 6_100 })).toBe(6_001);
		// This clock stepped forward by 500 ms: the old estimate no longer fits, it starts again.
		expect(clock.toLocal(8_000, { before: 7_499, dbNow: 8_000, after: 7_502 })).toBe(7_502);
	});

	it("reserves a tenth of a second's worth, at least one, never more than wait", () => {
		expect(slotsToReserve(1, 50)).toBe(1);
		expect(slotsToReserve(100, 50)).toBe(10);
		expect(slotsToReserve(10_000, 50)).toBe(50);
		expect(slotsToReserve(10_000, 5_000)).toBe(1_000);
		expect(slotsToReserve(100, 0)).toBe(1);
	});
});
