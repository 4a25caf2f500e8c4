// The ordering scenario of the delivery benchmark (BENCH_SCENARIOS=ordering): what ordering per
// order (issue 31) costs, each figure a ratio within one run, per engine (SQLite, PostgreSQL; one
// node each). Its receivers are "ordered" endpoints of their own (bench/lib/receiver.ts): they
// answer 500 to a status marked to fail and count statuses that arrive after a later one of their
// order. Throughput is distinct message ids answered 200 there; a burst or loop that loses anything
// within its bound is invalid and gets no rate, and a p99 over a run that lost anything is null.
//
//   1. per_order ÷ none, every event a different order: one deployment, two customers with the
//      same WEBHOOKS endpoints, one customer's webhooks `ordering: "none"`, the other's
//      "per_order"; bursts (open loop, every event sent at once) and closed loops, taking turns.
//   2. Five statuses per order ÷ distinct orders, on the per_order webhooks: bursts of the same
//      number of deliveries. A producer sends one order's statuses one after the other (each
//      acknowledged by the channel before the next), orders side by side, occurred_at increasing.
//   3. Claims stay O(due): WAITING rows laid down straight into the table behind WAITING_QUEUES
//      heads (a retry a week away) on the per_order webhooks, then the same distinct bursts: the
//      dispatcher's mean claim of due rows (webhook_delivery_claim_seconds) with ÷ without them,
//      and the claims' reads of due rows timed from here on the idle service (claimReads).
//   4. Bad neighbour: one per_order webhook, STUCK orders whose first status the receiver answers
//      500 (their four later statuses waiting behind it), beside healthy orders of the same
//      webhook. Healthy closed-loop throughput and open-loop p99 with ÷ without the stuck orders,
//      each on a fresh deployment, once per retry interval of the stuck heads (STUCK_RETRY_MS:
//      past the end of the run, so they fail once and then only wait; and due all run long). The
//      endpoint breaker (lib/endpoint-breaker.ts) is fed by the failures interleaved with the
//      successes; whether it opened during the measurement is read from the attempts table:
//      BREAKER.openAfter failures in a row, in the order the attempts started.
import crypto from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { ServiceBroker } from "moleculer";
import { BREAKER } from "../../mixins/dispatcher/shared";
import type { BacklogDeployment } from "./backlog";
import { startChild } from "./child";
import type { Probe } from "./cluster-nodes";
import { monotonicMs, type ReceiverReady } from "./receiver";
import { Receivers } from "./receivers";
import { percentile, ratioOrNull, round } from "./stats";
import { TASKING_ORDER_STATUS_TOPIC } from "../../lib/schemas/events";

const MODES = (process.env.BENCH_ORDERING_MODES ?? "sqlite,postgresql").split(",").filter(Boolean) as Array<"sqlite" | "postgresql">;
const WEBHOOKS = Number(process.env.BENCH_ORDERING_WEBHOOKS ?? 10);
const BURST = Number(process.env.BENCH_ORDERING_BURST ?? 5_000);
const ROUNDS = Number(process.env.BENCH_ORDERING_ROUNDS ?? 3);
const CLOSED_EVENTS = Number(process.env.BENCH_ORDERING_CLOSED_EVENTS ?? 500);
const WAITING = Number(process.env.BENCH_ORDERING_WAITING ?? 100_000);
const WAITING_QUEUES = Number(process.env.BENCH_ORDERING_WAITING_QUEUES ?? 1_000);
const STUCK = Number(process.env.BENCH_ORDERING_STUCK ?? 1_000);
// The stuck heads' retry intervals, one variant each: by default retries past the end of the run
// (the stuck orders fail once, then only wait) and retries due all run long (the breaker's case).
const STUCK_RETRY_MS = (process.env.BENCH_ORDERING_STUCK_RETRY_MS ?? "600000,2000").split(",").filter(Boolean).map(Number);
const NEIGHBOUR_EVENTS = Number(process.env.BENCH_ORDERING_NEIGHBOUR_EVENTS ?? 2_000);
const LATENCY_SECONDS = Number(process.env.BENCH_ORDERING_LATENCY_SECONDS ?? 6);
const STATUSES = ["committed", "staged", "in progress", "fulfilled", "expired"];
const SENDERS = 256;
const IN_SYSTEM = 64;
const WARM_UP_EVENTS = 200;
const READS = 200;
export const ORDERING_GOALS = { per_order_vs_none: 0.95, five_statuses_vs_distinct: 0.8, neighbour_throughput_with_vs_without: 0.8, neighbour_p99_with_vs_without: 1.5, claim_with_waiting_vs_without: "about 1" };

/** A deployment of the service with no webhooks yet (the scenario creates its own). */
export interface OrderingDeployment extends BacklogDeployment {
	producer: ServiceBroker;
}

export interface OrderingHarness {
	key: string;
	cert: string;
	deploy(options: { engine: "sqlite" | "postgresql"; env?: Record<string, string> }): Promise<OrderingDeployment>;
	probe(nodes: BacklogDeployment["dispatchers"]): Promise<Probe[]>;
}

interface Context {
	harness: OrderingHarness;
	receivers: Receivers;
	urls: string[];
}

const median = (values: number[]) => percentile(values, 50);
const rateOf = (runs: Array<{ deliveries_per_s: number | null }>) => (runs.length > 0 && runs.every(run => run.deliveries_per_s !== null) ? median(runs.map(run => run.deliveries_per_s!)) : null);
const tag = crypto.randomBytes(3).toString("hex");
let orders = 0;

/** One order's statuses (1 to 5), occurred_at strictly increasing; `extra` goes into each one's data. */
function orderStatuses(customer: string, count: number, extra: (seq: number) => Record<string, unknown> = () => ({}), kind = "order"): object[] {
	orders += 1;
	const orderId = `${kind}-${tag}-${orders}`;
	const start = Date.now();
	return Array.from({ length: count }, (_, seq) => ({
		customer_id: customer,
		user_id: "bench-user",
		order_id: orderId,
		status: STATUSES[seq],
		occurred_at: new Date(start + seq).toISOString(),
		order_name: "Benchmark order",
		details: { seq, ...extra(seq) },
	}));
}

async function createWebhooks(deployment: OrderingDeployment, customer: string, urls: string[], ordering: "none" | "per_order"): Promise<string[]> {
	const ids = [];
	for (const [i, url] of urls.entries()) {
		const webhook = await deployment.producer.call<{ id: string }, object>("webhooks.create", { name: `${customer}-${i}`, url, events: [TASKING_ORDER_STATUS_TOPIC], ordering }, { meta: { customerId: customer } });
		ids.push(webhook.id);
	}
	return ids;
}

function claimTotals(probes: Probe[]): { count: number; seconds: number } {
	return probes.reduce((sum, probe) => ({ count: sum.count + (probe.claims_due ?? 0), seconds: sum.seconds + (probe.claims_due_seconds ?? 0) }), { count: 0, seconds: 0 });
}

interface RunFigures {
	deliveries: number;
	received: number;
	lost: number;
	repeats: number;
	out_of_order: number;
	valid: boolean;
	seconds: number;
	deliveries_per_s: number | null;
	/** Answered within the run, per second, valid or not: how far a run that stalled got. */
	answered_per_s: number;
	claims_due: number;
	claim_due_mean_ms: number | null;
}

/** Measures `work` (which sends), until the receivers answered `expected` more deliveries or the bound passed. */
async function measured(ctx: Context, deployment: OrderingDeployment, expected: number, work: (cancelled: () => boolean) => Promise<number>): Promise<RunFigures & { intake_seconds: number }> {
	const { receivers } = ctx;
	const base = { ok: receivers.ok, repeats: receivers.repeats, outOfOrder: receivers.outOfOrder };
	const claimsBefore = claimTotals(await ctx.harness.probe(deployment.dispatchers));
	let cancelled = false;
	const started = monotonicMs();
	let intakeSeconds = NaN;
	let failedSends = 0;
	const sending = work(() => cancelled).then(failed => {
		failedSends = failed;
		intakeSeconds = (monotonicMs() - started) / 1000;
	});
	// A minute, plus 10 ms per delivery.
	const drained = await receivers.drainedWithin(base.ok + expected, 60_000 + 10 * expected);
	cancelled = true;
	await sending;
	const seconds = (monotonicMs() - started) / 1000;
	const claimsAfter = claimTotals(await ctx.harness.probe(deployment.dispatchers));
	const received = receivers.ok - base.ok;
	const valid = drained && failedSends === 0 && received === expected;
	const claims = claimsAfter.count - claimsBefore.count;
	return {
		deliveries: expected,
		received,
		lost: expected - received,
		repeats: receivers.repeats - base.repeats,
		out_of_order: receivers.outOfOrder - base.outOfOrder,
		valid,
		seconds: round(seconds),
		intake_seconds: round(intakeSeconds),
		deliveries_per_s: valid ? round(expected / seconds) : null,
		answered_per_s: round(received / seconds),
		claims_due: claims,
		claim_due_mean_ms: claims > 0 ? round(((claimsAfter.seconds - claimsBefore.seconds) / claims) * 1000, 3) : null,
	};
}

/** Open loop: every chain at once (SENDERS producer calls in flight), each chain's events one after the other. */
function burst(ctx: Context, deployment: OrderingDeployment, chains: object[][], webhooks: number, label: string) {
	const expected = chains.reduce((sum, chain) => sum + chain.length, 0) * webhooks;
	return measured(ctx, deployment, expected, async () => {
		let next = 0;
		let failed = 0;
		const sender = async () => {
			while (next < chains.length) for (const event of chains[next++]) await deployment.send(event).catch(() => (failed += 1));
		};
		await Promise.all(Array.from({ length: Math.min(SENDERS, chains.length) }, sender));
		return failed;
	}).then(figures => {
		process.stderr.write(`bench delivery: ordering ${label}: ${figures.valid ? `${Math.round(figures.deliveries_per_s!)}/s` : `INVALID, ${figures.lost} missing`}, ${figures.out_of_order} out of order\n`);
		return figures;
	});
}

/** Closed loop: at most IN_SYSTEM events not yet answered, each a different order. */
function closedLoop(ctx: Context, deployment: OrderingDeployment, customer: string, events: number, webhooks: number, extra: () => Record<string, unknown> = () => ({})) {
	const base = ctx.receivers.ok;
	return measured(ctx, deployment, events * webhooks, async cancelled => {
		let next = 0;
		let failed = 0;
		const publisher = async () => {
			while (next < events && !cancelled()) {
				const i = next++;
				await ctx.receivers.waitForOk(base + (i - IN_SYSTEM + 1) * webhooks);
				// A loop past its bound stops here instead of sending into the next measurement.
				if (cancelled()) return;
				await deployment.send(orderStatuses(customer, 1, extra)[0]).catch(() => (failed += 1));
			}
		};
		await Promise.race([Promise.all(Array.from({ length: Math.min(IN_SYSTEM, events) }, publisher)), until(cancelled)]);
		return failed;
	});
}

async function until(condition: () => boolean): Promise<void> {
	while (!condition()) await sleep(50);
}

/** Distinct orders: one status each. */
const distinct = (customer: string, deliveries: number, webhooks: number) => Array.from({ length: Math.ceil(deliveries / webhooks) }, () => orderStatuses(customer, 1));
/** The same number of deliveries as orders of five statuses each. */
const fiveEach = (customer: string, deliveries: number, webhooks: number) => Array.from({ length: Math.ceil(deliveries / webhooks / STATUSES.length) }, () => orderStatuses(customer, STATUSES.length));

/**
 * Lays down `waiting` rows pending behind `queues` heads, spread over the webhooks: each head a
 * retry a week away (never due during the run), each waiting row as intake writes one
 * (next_attempt_at NULL), each row with a message of its own (a webhook gets one delivery per
 * event), in statements of the database itself.
 */
async function addWaiting(deployment: OrderingDeployment, webhookIds: string[], customer: string, queues: number, waiting: number): Promise<void> {
	const { db, engine } = deployment;
	const now = new Date().toISOString();
	const later = new Date(Date.now() + 7 * 24 * 3_600_000).toISOString();
	const pg = engine === "postgresql";
	const newId = pg ? "gen_random_uuid()" : "lower(hex(randomblob(16)))"; // a delivery's id is uuid on PostgreSQL
	const text = (expression: string) => (pg ? `(${expression})::text` : `(${expression})`);
	const numbers = (count: number) => (pg ? `generate_series(0, ${count - 1}) AS n(i)` : `(WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < ${count - 1}) SELECT i FROM s) AS n`);
	const messageColumns = "event_id, customer_id, user_id, type, body, occurred_at, created_at";
	const columns = "id, event_id, webhook_id, customer_id, status, attempt_count, next_attempt_at, created_at, updated_at, order_key, waiting";
	const perWebhook = Math.ceil(queues / webhookIds.length);
	const waitingPerWebhook = Math.ceil(waiting / webhookIds.length);
	/** `count` rows from `offset` on: messages first, then a delivery of each, keyed by n.i. */
	const insert = async (kind: string, webhookId: string, offset: number, count: number, nextAttempt: string | null, attempts: number, isWaiting: boolean, orderOf: string) => {
		// An event id is uuid on PostgreSQL: there, the same text's digest as a UUID.
		const eventText = `'${kind}${tag}-' || ${text(`n.i + ${offset}`)}`;
		const eventId = pg ? `md5(${eventText})::uuid` : eventText;
		await db.raw(`INSERT INTO delivery_messages (${messageColumns}) SELECT ${eventId}, ?, 'bench-user', 'tasking:order_status', '{}', ?, ? FROM ${numbers(count)}`, [customer, now, now]);
		await db.raw(
			`INSERT INTO deliveries (${columns}) SELECT ${newId}, ${eventId}, ?, ?, 'pending', ${attempts}, ?, ?, ?, ${orderOf}, ${isWaiting ? (pg ? "true" : "1") : pg ? "false" : "0"} FROM ${numbers(count)}`,
			[webhookId, customer, nextAttempt, now, now],
		);
	};
	for (const [w, webhookId] of webhookIds.entries()) {
		const queueKey = (index: string) => `'waiting-${tag}-${w}-' || ${text(index)}`;
		await insert(`h${w}-`, webhookId, 0, perWebhook, later, 1, false, queueKey("n.i"));
		for (let done = 0; done < waitingPerWebhook; done += 50_000) {
			const rows = Math.min(50_000, waitingPerWebhook - done);
			await insert(`w${w}-`, webhookId, done, rows, null, 0, true, queueKey(`(n.i + ${done}) % ${perWebhook}`));
		}
	}
	// As the backlog scenario does: what a bulk insert leaves due is settled before measuring.
	if (pg) {
		await db.raw("VACUUM ANALYZE deliveries");
		await db.raw("CHECKPOINT");
	}
}

/**
 * The claim's read of due rows, timed straight from here while the service idles: the first step
 * of claims.mixin.ts's claim of all due rows, and of a webhook's refill or probe, each the mean of
 * READS runs. Bursts small enough to be leased straight from intake make few claims to time.
 */
async function claimReads(deployment: OrderingDeployment, webhookId: string): Promise<{ due_ms: number; webhook_ms: number }> {
	const timed = async (sql: string, bindings: Array<string | number>) => {
		for (let i = 0; i < 10; i++) await deployment.db.raw(sql, bindings);
		const started = monotonicMs();
		for (let i = 0; i < READS; i++) await deployment.db.raw(sql, bindings);
		return round((monotonicMs() - started) / READS, 3);
	};
	const now = new Date().toISOString();
	return {
		due_ms: await timed("SELECT id, webhook_id, next_attempt_at FROM deliveries WHERE status = 'pending' AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT ?", [now, 2_000]),
		webhook_ms: await timed("SELECT id FROM deliveries WHERE webhook_id = ? AND status = 'pending' AND next_attempt_at <= ? ORDER BY next_attempt_at, id LIMIT ?", [webhookId, now, 1]),
	};
}

/** Scenarios 1-3 on one deployment. */
async function orderingCost(ctx: Context, engine: "sqlite" | "postgresql") {
	const deployment = await ctx.harness.deploy({ engine });
	try {
		const noneIds = await createWebhooks(deployment, "bench-none", ctx.urls, "none");
		const orderedIds = await createWebhooks(deployment, "bench-ordered", ctx.urls, "per_order");
		const w = ctx.urls.length;
		await burst(ctx, deployment, distinct("bench-none", BURST, w), w, "warm-up none");
		await burst(ctx, deployment, distinct("bench-ordered", BURST, w), w, "warm-up per_order");
		const none = { bursts: [] as RunFigures[], closed_loops: [] as RunFigures[] };
		const perOrder = { bursts: [] as RunFigures[], closed_loops: [] as RunFigures[], five_status_bursts: [] as RunFigures[] };
		for (let round = 0; round < ROUNDS; round++) {
			none.bursts.push(await burst(ctx, deployment, distinct("bench-none", BURST, w), w, "burst none"));
			perOrder.bursts.push(await burst(ctx, deployment, distinct("bench-ordered", BURST, w), w, "burst per_order"));
			perOrder.five_status_bursts.push(await burst(ctx, deployment, fiveEach("bench-ordered", BURST, w), w, "burst per_order, 5 statuses per order"));
		}
		for (let round = 0; round < ROUNDS; round++) {
			none.closed_loops.push(await closedLoop(ctx, deployment, "bench-none", CLOSED_EVENTS, w));
			perOrder.closed_loops.push(await closedLoop(ctx, deployment, "bench-ordered", CLOSED_EVENTS, w));
		}
		const readsWithout = await claimReads(deployment, orderedIds[0]);
		const started = monotonicMs();
		process.stderr.write(`bench delivery: ordering: laying down ${WAITING} waiting rows behind ${WAITING_QUEUES} heads\n`);
		await addWaiting(deployment, orderedIds, "bench-ordered", WAITING_QUEUES, WAITING);
		const insertSeconds = round((monotonicMs() - started) / 1000);
		const readsWith = await claimReads(deployment, orderedIds[0]);
		const withWaiting: RunFigures[] = [];
		for (let round = 0; round < ROUNDS; round++) withWaiting.push(await burst(ctx, deployment, distinct("bench-ordered", BURST, w), w, `burst per_order, ${WAITING} waiting`));
		const claimMean = (runs: RunFigures[]) => {
			const claims = runs.reduce((sum, run) => sum + run.claims_due, 0);
			return claims > 0 ? round(runs.reduce((sum, run) => sum + (run.claim_due_mean_ms ?? 0) * run.claims_due, 0) / claims, 3) : null;
		};
		const rates = { noneBurst: rateOf(none.bursts), orderedBurst: rateOf(perOrder.bursts), noneClosed: rateOf(none.closed_loops), orderedClosed: rateOf(perOrder.closed_loops), five: rateOf(perOrder.five_status_bursts) };
		return {
			webhooks: { none: noneIds.length, per_order: orderedIds.length },
			per_order_vs_none: {
				none: { ...none, burst_deliveries_per_s: rates.noneBurst, closed_loop_deliveries_per_s: rates.noneClosed },
				per_order: { bursts: perOrder.bursts, closed_loops: perOrder.closed_loops, burst_deliveries_per_s: rates.orderedBurst, closed_loop_deliveries_per_s: rates.orderedClosed },
				burst_ratio: ratioOrNull(rates.orderedBurst, rates.noneBurst),
				closed_loop_ratio: ratioOrNull(rates.orderedClosed, rates.noneClosed),
			},
			five_statuses_vs_distinct: {
				distinct_deliveries_per_s: rates.orderedBurst,
				five_statuses: { bursts: perOrder.five_status_bursts, deliveries_per_s: rates.five },
				ratio: ratioOrNull(rates.five, rates.orderedBurst),
			},
			claims_with_waiting: {
				waiting: WAITING,
				queues: WAITING_QUEUES,
				insert_seconds: insertSeconds,
				without: { claims_due: perOrder.bursts.reduce((sum, run) => sum + run.claims_due, 0), claim_due_mean_ms: claimMean(perOrder.bursts), deliveries_per_s: rates.orderedBurst },
				with: { bursts: withWaiting, claims_due: withWaiting.reduce((sum, run) => sum + run.claims_due, 0), claim_due_mean_ms: claimMean(withWaiting), deliveries_per_s: rateOf(withWaiting) },
				claim_ratio: ratioOrNull(claimMean(withWaiting), claimMean(perOrder.bursts)),
				claim_reads: { without: readsWithout, with: readsWith, due_ratio: ratioOrNull(readsWith.due_ms, readsWithout.due_ms), webhook_ratio: ratioOrNull(readsWith.webhook_ms, readsWithout.webhook_ms) },
				burst_rate_ratio: ratioOrNull(rateOf(withWaiting), rates.orderedBurst),
			},
		};
	} finally {
		await deployment.stop();
	}
}

/** Open loop at `perSecond` healthy events (one webhook), each carrying sent_at, for LATENCY_SECONDS. */
async function latency(ctx: Context, deployment: OrderingDeployment, customer: string, perSecond: number) {
	await ctx.receivers.samples(); // drops whatever arrived before
	const total = Math.max(1, Math.round(perSecond * LATENCY_SECONDS));
	const figures = await measured(ctx, deployment, total, async cancelled => {
		const started = monotonicMs();
		let sent = 0;
		let failed = 0;
		while (sent < total && !cancelled()) {
			const due = Math.min(total, Math.floor(((monotonicMs() - started) / 1000) * perSecond) + 1);
			for (; sent < due; sent++) deployment.send(orderStatuses(customer, 1, () => ({ sent_at: monotonicMs() }))[0]).catch(() => (failed += 1));
			await sleep(2);
		}
		return failed;
	});
	const samples = (await ctx.receivers.samples()).map(([, ms]) => ms);
	const pick = (p: number) => (figures.lost === 0 ? round(percentile(samples, p)) : null);
	return { offered_deliveries_per_s: round(perSecond), samples: samples.length, lost: figures.lost, valid: figures.valid, p50_ms: pick(50), p99_ms: pick(99), max_ms: pick(100) };
}

/** The longest run of failed attempts in a row at the webhook since `since`, in the order they started. */
async function longestFailureRun(deployment: OrderingDeployment, webhookId: string, since: string): Promise<{ attempts: number; failures: number; longest: number }> {
	const rows: Array<{ success: unknown }> = await deployment.db("delivery_attempt_log as a")
		.join("deliveries as d", "d.id", "a.delivery_id")
		.where("d.webhook_id", webhookId)
		.andWhere("a.attempted_at", ">=", since)
		.orderBy([{ column: "a.attempted_at" }, { column: "a.delivery_id" }, { column: "a.attempt" }])
		.select("a.success");
	let longest = 0;
	let run = 0;
	let failures = 0;
	for (const row of rows) {
		const success = Boolean(Number(row.success));
		run = success ? 0 : run + 1;
		if (!success) failures += 1;
		longest = Math.max(longest, run);
	}
	return { attempts: rows.length, failures, longest };
}

/** Scenario 4, one side: a fresh deployment with one per_order webhook, with or without the stuck orders. */
async function neighbour(ctx: Context, engine: "sqlite" | "postgresql", stuck: number, retryMs: number, offered?: number) {
	// Retries every retryMs for at least ten minutes: the stuck heads never run out of them during the run.
	const offsets = Array.from({ length: Math.max(1, Math.ceil(600_000 / retryMs)) }, (_, i) => `${(i + 1) * retryMs}ms`).join(",");
	const deployment = await ctx.harness.deploy({ engine, env: { DELIVERY_RETRY_SCHEDULE: offsets } });
	try {
		const [webhookId] = await createWebhooks(deployment, "bench-neighbour", ctx.urls.slice(0, 1), "per_order");
		let stuckSetup = {};
		if (stuck > 0) {
			const chains = Array.from({ length: stuck }, () => orderStatuses("bench-neighbour", STATUSES.length, seq => (seq === 0 ? { bench_fail: true } : {}), "stuck"));
			let next = 0;
			await Promise.all(Array.from({ length: Math.min(SENDERS, stuck) }, async () => {
				while (next < chains.length) for (const event of chains[next++]) await deployment.send(event);
			}));
			// Every head tried at least once, and every later status in, waiting: then the stuck orders are stuck.
			const count = async (where: { waiting: boolean }, attempted: number) =>
				Number((await deployment.db("deliveries").where({ webhook_id: webhookId, status: "pending", ...where }).andWhere("attempt_count", ">=", attempted).count({ count: "*" }))[0].count);
			const bound = monotonicMs() + 120_000;
			while (((await count({ waiting: false }, 1)) < stuck || (await count({ waiting: true }, 0)) < stuck * (STATUSES.length - 1)) && monotonicMs() < bound) await sleep(100);
			stuckSetup = { stuck_heads_attempted: await count({ waiting: false }, 1), waiting_rows: await count({ waiting: true }, 0) };
		}
		await closedLoop(ctx, deployment, "bench-neighbour", WARM_UP_EVENTS, 1);
		const since = new Date().toISOString();
		const failBefore = ctx.receivers.fail;
		const throughput = await closedLoop(ctx, deployment, "bench-neighbour", NEIGHBOUR_EVENTS, 1);
		const perSecond = offered ?? (throughput.deliveries_per_s ?? 0) / 2;
		const steady = await latency(ctx, deployment, "bench-neighbour", perSecond);
		const failures = ctx.receivers.fail - failBefore;
		const attempts = await longestFailureRun(deployment, webhookId, since);
		const stuckLeft = stuck > 0 ? { stuck_heads_still_pending: Number((await deployment.db("deliveries").where({ webhook_id: webhookId, status: "pending", waiting: false }).andWhere("order_key", "like", "stuck-%").count({ count: "*" }))[0].count) } : {};
		return {
			...stuckSetup,
			...stuckLeft,
			throughput,
			healthy_deliveries_per_s: throughput.deliveries_per_s,
			latency: steady,
			failed_answers_during_measurement: failures,
			breaker: { attempts: attempts.attempts, failed_attempts: attempts.failures, longest_failure_run: attempts.longest, opened: attempts.longest >= BREAKER.openAfter, open_after: BREAKER.openAfter },
			perSecond,
		};
	} finally {
		await deployment.stop();
	}
}

/** Without the stuck orders once, then with them once per retry interval, at the same offered load. */
async function badNeighbour(ctx: Context, engine: "sqlite" | "postgresql") {
	const without = await neighbour(ctx, engine, 0, STUCK_RETRY_MS[0]);
	const variants = [];
	for (const retryMs of STUCK_RETRY_MS) {
		const withStuck = await neighbour(ctx, engine, STUCK, retryMs, without.perSecond);
		variants.push({
			stuck_retry_every_ms: retryMs,
			with: { ...withStuck, perSecond: undefined },
			throughput_with_vs_without: ratioOrNull(withStuck.healthy_deliveries_per_s, without.healthy_deliveries_per_s),
			// Valid or not: a run that stalled past its bound still says how far it got.
			answered_rate_with_vs_without: ratioOrNull(withStuck.throughput.answered_per_s, without.throughput.answered_per_s),
			p99_with_vs_without: ratioOrNull(withStuck.latency.p99_ms, without.latency.p99_ms),
			breaker_opened: withStuck.breaker.opened,
		});
	}
	return { stuck_orders: STUCK, statuses_per_stuck_order: STATUSES.length, without: { ...without, perSecond: undefined }, variants };
}

export async function orderingScenario(harness: OrderingHarness) {
	const receivers = new Receivers(
		await startChild<ReceiverReady>(`${__dirname}/receiver.ts`, { RECEIVER_ENDPOINTS: Array(WEBHOOKS).fill("ordered").join(","), RECEIVER_KEY: harness.key, RECEIVER_CERT: harness.cert }),
	);
	const ctx: Context = { harness, receivers, urls: receivers.ports.map(port => `https://127.0.0.1:${port}/hook`) };
	const results: Record<string, unknown> = {};
	try {
		for (const engine of MODES) {
			process.stderr.write(`bench delivery: ordering ${engine}\n`);
			results[engine] = { ...(await orderingCost(ctx, engine)), bad_neighbour: await badNeighbour(ctx, engine) };
		}
	} finally {
		await receivers.stop();
	}
	return {
		goals: ORDERING_GOALS,
		sizes: { webhooks: WEBHOOKS, burst_deliveries: BURST, rounds: ROUNDS, closed_loop_events: CLOSED_EVENTS, waiting: WAITING, waiting_queues: WAITING_QUEUES, stuck_orders: STUCK, stuck_retry_every_ms: STUCK_RETRY_MS, neighbour_events: NEIGHBOUR_EVENTS, latency_seconds: LATENCY_SECONDS },
		...results,
	};
}
