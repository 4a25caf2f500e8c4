// The per-endpoint circuit breaker (lib/endpoint-breaker.ts): its states on their own, then end to
// end with a real HTTPS receiver on SQLite and PostgreSQL: an endpoint that fails everything gets
// a probe a second instead of every due retry, its healthy neighbour is unaffected, nothing is
// lost, and the pile drains once a probe succeeds.
import { EndpointBreakers } from "../lib/endpoint-breaker";
import { BREAKER } from "../mixins/dispatcher/shared";
import { testDatabases } from "./helpers/services";
import { newCustomer, orderEvent, sleep, startDeliveryStack, verified, waitUntil, type DeliveryStack } from "./helpers/delivery-stack";

describe("EndpointBreakers", () => {
	const breakers = () => new EndpointBreakers({ openAfter: 3, probeEveryMs: 1_000, quietMs: 5_000 });

	it("does not open for an endpoint that answered some delivery within quietMs: it refuses some, it is not down", () => {
		const b = breakers();
		b.record("w", true, 0);
		for (let i = 1; i <= 10; i++) expect(b.record("w", false, i * 100)).toBeNull();
		// Failing, so one attempt at a time, but never only probes.
		expect(b.isOpen("w")).toBe(false);
		expect(b.attemptLimit("w", 8, 1_000)).toBe(1);
		// Nothing succeeded for quietMs: the next failure opens it.
		expect(b.record("w", false, 5_000)).toBe("opened");
		expect(b.isOpen("w")).toBe(true);
	});

	it("takes turns for the probes: the row due longest, then the one due last", () => {
		const b = breakers();
		for (let i = 0; i < 3; i++) b.record("w", false, i);
		expect([b.probeTakesNewest("w"), b.probeTakesNewest("w"), b.probeTakesNewest("w"), b.probeTakesNewest("w")]).toEqual([false, true, false, true]);
		expect(b.probeTakesNewest("unknown")).toBe(false);
	});

	it("gives a healthy endpoint its full concurrency, a failing one a single attempt, and an open one nothing until its probe is due", () => {
		const b = breakers();
		expect(b.attemptLimit("w", 8, 0)).toBe(8);
		expect(b.record("w", false, 0)).toBeNull();
		expect(b.attemptLimit("w", 8, 0)).toBe(1);
		expect(b.isOpen("w")).toBe(false);
		expect(b.record("w", false, 10)).toBeNull();
		expect(b.record("w", false, 20)).toBe("opened");
		expect(b.isOpen("w")).toBe(true);
		expect(b.attemptLimit("w", 8, 500)).toBe(0);
		expect(b.open(500)).toEqual([{ webhookId: "w", probeDue: false }]);
		expect(b.attemptLimit("w", 8, 1_020)).toBe(1);
		expect(b.open(1_020)).toEqual([{ webhookId: "w", probeDue: true }]);
		// A failed probe: the next one a full interval later, and "opened" is said only once.
		expect(b.record("w", false, 1_100)).toBeNull();
		expect(b.attemptLimit("w", 8, 2_050)).toBe(0);
		expect(b.attemptLimit("w", 8, 2_100)).toBe(1);
		expect(b.record("w", true, 2_200)).toBe("closed");
		expect(b.attemptLimit("w", 8, 2_200)).toBe(8);
		expect(b.open(2_200)).toEqual([]);
	});

	it("closes quietly for an endpoint that failed fewer times than it takes to open, and forgets on demand", () => {
		const b = breakers();
		b.record("w", false, 0);
		expect(b.record("w", true, 1)).toBeNull();
		for (let i = 0; i < 3; i++) b.record("x", false, i);
		b.forget("x");
		expect(b.isOpen("x")).toBe(false);
		expect(b.attemptLimit("x", 8, 3)).toBe(8);
		// Endpoints are independent.
		for (let i = 0; i < 3; i++) b.record("y", false, i);
		expect(b.isOpen("y")).toBe(true);
		expect(b.attemptLimit("z", 8, 3)).toBe(8);
	});
});

describe.each(testDatabases())("an endpoint that fails everything, on %s", database => {
	let env: DeliveryStack;
	const EVENTS = 40;
	const WEBHOOK_CONCURRENCY = 8;

	beforeAll(async () => {
		// Retries due 100 ms after each failure: without the breaker, the dead endpoint would be
		// attempted back to back for as long as the test runs.
		const schedule = Array.from({ length: 60 }, (_, i) => `${(i + 1) * 100}ms`).join(",");
		env = await startDeliveryStack(database, { env: { DELIVERY_RETRY_SCHEDULE: schedule, DELIVERY_WEBHOOK_CONCURRENCY: String(WEBHOOK_CONCURRENCY) } });
	});
	afterAll(() => env?.stop());

	it("gets one probe a second once it has failed BREAKER.openAfter times in a row, while its neighbour is served; once a probe succeeds, everything is delivered", async () => {
		const alice = await newCustomer(env.stack);
		const dead = await env.createWebhook(alice.token);
		const healthy = await env.createWebhook(alice.token);
		env.script(dead, [], { status: 500 });
		const events = Array.from({ length: EVENTS }, () => orderEvent(alice));
		for (const event of events) await env.stack.app.broker.call("dispatcher.publish", event);

		await waitUntil(() => env.received(healthy).length, count => count >= EVENTS, "the healthy webhook's deliveries");
		await waitUntil(() => env.received(dead).length, count => count >= BREAKER.openAfter, "the dead endpoint to fail enough to open");
		// The attempts already in flight when the breaker opened (at most the webhook's concurrency,
		// all started before the first failure came back) arrive together; then the probes, each at
		// least an interval after the one before. Without the breaker: a due retry every 100 ms for
		// each of 40 deliveries.
		await sleep(3_500);
		const arrivals = env.received(dead).map(request => request.receivedAt.getTime());
		const attempts = arrivals.length;
		const firstProbe = arrivals.findIndex((at, i) => i > 0 && at - arrivals[i - 1] >= 900);
		console.log(JSON.stringify({ database, dead_attempts: attempts, arrivals_ms: arrivals.map(at => at - arrivals[0]) }));
		expect(firstProbe).toBeGreaterThanOrEqual(BREAKER.openAfter);
		expect(firstProbe).toBeLessThanOrEqual(WEBHOOK_CONCURRENCY);
		const probes = arrivals.slice(firstProbe);
		for (let i = 1; i < probes.length; i++) expect(probes[i] - probes[i - 1]).toBeGreaterThanOrEqual(BREAKER.probeEveryMs - 50);
		expect(probes.length).toBeLessThanOrEqual(Math.ceil((Date.now() - arrivals[firstProbe - 1]) / BREAKER.probeEveryMs));
		// Every delivery of the dead endpoint is still pending: none lost an attempt or was given up.
		// Every attempt that arrived is recorded. The probes go on meanwhile, so the count is read at a
		// moment when no probe is between its arrival and the write of its result.
		const attemptsRecorded = (found: Array<{ attempt_count: number | string }>) => found.reduce((sum, row) => sum + Number(row.attempt_count), 0);
		const rows = await waitUntil(() => env.stack.db("deliveries").where({ webhook_id: dead.id }), found => attemptsRecorded(found) === env.received(dead).length, "every attempt that arrived to be recorded");
		expect(rows).toHaveLength(EVENTS);
		expect(rows.every(row => row.status === "pending")).toBe(true);
		expect(attemptsRecorded(rows)).toBeGreaterThanOrEqual(attempts);

		// The endpoint comes back: the next probe succeeds and the pile drains at full speed.
		env.script(dead, [], { status: 200 });
		const done = await waitUntil(() => env.stack.db("deliveries").where({ webhook_id: dead.id, status: "succeeded" }), found => found.length === EVENTS, "every delivery of the recovered endpoint");
		expect(done).toHaveLength(EVENTS);
		const delivered = new Set(env.received(dead).filter(request => request.answeredStatus === 200).map(request => verified(request, dead.secret).data.order_id));
		expect(delivered.size).toBe(EVENTS);
		const answeredOk = env.received(dead).filter(request => request.answeredStatus === 200).length;
		console.log(JSON.stringify({ database, sent: EVENTS, delivered: delivered.size, lost: EVENTS - delivered.size, repeats: answeredOk - delivered.size }));
		expect(new Set(env.received(healthy).map(request => verified(request, healthy.secret).data.order_id)).size).toBe(EVENTS);
	});
});

describe.each(testDatabases())("an open breaker's probes while a slow webhook holds the instance's leases, on %s", database => {
	let env: DeliveryStack;
	// One attempt at a time, and one webhook may hold every lease of the instance (its fixed share,
	// 4 x 16, is the instance's budget).
	const BUDGET = 64;

	beforeAll(async () => {
		const schedule = Array.from({ length: 60 }, (_, i) => `${(i + 1) * 100}ms`).join(",");
		env = await startDeliveryStack(database, { env: { DELIVERY_RETRY_SCHEDULE: schedule, DELIVERY_CONCURRENCY: "1", DELIVERY_WEBHOOK_CONCURRENCY: "4", DELIVERY_MAX_LEASES: String(BUDGET) } });
	});
	afterAll(() => env?.stop());

	it("are still claimed once a second: a recovered endpoint is not left waiting until the load passes", async () => {
		const dispatcher = env.stack.app.broker.getLocalService("dispatcher") as unknown as { held: number };
		const failing = await newCustomer(env.stack);
		const busy = await newCustomer(env.stack);
		const dead = await env.createWebhook(failing.token);
		const slow = await env.createWebhook(busy.token);
		env.script(dead, [], { status: 500 });
		env.script(slow, [], { status: 200, delayMs: 100 });
		for (let i = 0; i < BREAKER.openAfter; i++) await env.stack.app.broker.call("dispatcher.publish", orderEvent(failing));
		await waitUntil(() => env.received(dead).length, count => count >= BREAKER.openAfter, "the dead endpoint to fail enough to open");

		// The slow webhook's deliveries take every lease of the instance (and more wait in the
		// database) for about 18 s: one at a time, 100 ms each. With 12 s, publishing them on a slow
		// machine took long enough that 61 were answered by the end of the window below.
		const SLOW_EVENTS = BUDGET + 120;
		for (let i = 0; i < SLOW_EVENTS; i++) await env.stack.app.broker.call("dispatcher.publish", orderEvent(busy));
		// Refilled by a claim whenever it is down to half.
		expect(dispatcher.held).toBeGreaterThanOrEqual(BUDGET / 2);
		const before = env.received(dead).length;
		await sleep(5_000);
		const probes = env.received(dead).length - before;
		const slowAnswered = env.received(slow).length;
		console.log(JSON.stringify({ database, held: dispatcher.held, slow_answered: slowAnswered, probes_in_5_s: probes }));
		// The load has not passed: rows of the slow webhook still wait beyond what the instance holds.
		expect(slowAnswered).toBeLessThan(SLOW_EVENTS - BUDGET);
		expect(probes).toBeGreaterThanOrEqual(2);

		// A probe succeeds: the dead endpoint's deliveries go out while the slow ones still hold the instance.
		env.script(dead, [], { status: 200 });
		await waitUntil(() => env.stack.db("deliveries").where({ webhook_id: dead.id, status: "succeeded" }), found => found.length === BREAKER.openAfter, "every delivery of the recovered endpoint");
		// The slow endpoint has made its point; answering at once, its remaining ~100 deliveries take
		// a second instead of ten, and every one must still arrive.
		env.script(slow, [], { status: 200 });
		await waitUntil(() => env.stack.db("deliveries").where({ webhook_id: slow.id, status: "succeeded" }), found => found.length === SLOW_EVENTS, "every delivery of the slow webhook");
	});
});
