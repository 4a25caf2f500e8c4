// Retention benchmark (npm run bench, "retention" part; or `tsx bench/retention.ts` alone).
//
// Does pruning a large backlog slow deliveries down? Seed 1,000,000 finished rows older than
// RETENTION_PERIOD (messages, their succeeded deliveries and two attempts each), then measure the
// dispatcher's sustained delivery rate to a loopback HTTPS receiver (the same load as the
// `delivery` part) three times: before pruning, while `dispatcher.prune` (the real scheduled
// run, batched and paced) works through the backlog, and after. Ratio: the rate during pruning
// over the mean of the rates before and after. Goal: at least 0.8.
//
// Embedded default: SQLite under a temporary DATA_DIR; BENCH_DATABASE_URL=postgres://… measures
// PostgreSQL instead (in a throw-away schema).
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";
import type { Knex } from "knex";
import { isPostgres } from "../mixins/db.mixin";
import { startBenchTarget, type Receiver } from "./lib/bench-target";
import { startBenchApp, type BenchApp } from "./lib/bench-app";
import { round } from "./lib/stats";
import { TASKING_ORDER_STATUS_TOPIC } from "../lib/schemas/events";

const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 64);
const ROWS = Number(process.env.BENCH_RETENTION_ROWS ?? 1_000_000);
const DELIVERIES = Number(process.env.BENCH_RETENTION_DELIVERIES ?? 10_000);
const IN_SYSTEM = 4 * CONCURRENCY;
const GOAL_RATIO = 0.8;
/** Rows per seeded message: the message, one delivery, two attempts. */
const ROWS_PER_MESSAGE = 4;

/** Seeds finished work 40 days old, in the database itself (fast on both engines). */
async function seedOld(db: Knex, messages: number): Promise<void> {
	const old = new Date(Date.now() - 40 * 86_400_000).toISOString();
	const body = JSON.stringify({ type: TASKING_ORDER_STATUS_TOPIC, timestamp: old, data: { order_id: "old", status: "fulfilled", user_id: "old-user" } });
	if (isPostgres(db)) {
		const series = `FROM generate_series(0, ? - 1) AS i`;
		await db.raw(`INSERT INTO delivery_messages (event_id, customer_id, user_id, type, body, occurred_at, created_at)
			SELECT ('00000000-0000-4000-8000-' || lpad(i::text, 12, '0'))::uuid, 'old', 'old-user', 'tasking:order_status', ?, ?, ? ${series}`, [body, old, old, messages]);
		await db.raw(`INSERT INTO deliveries (id, event_id, webhook_id, customer_id, status, attempt_count, created_at, updated_at)
			SELECT ('10000000-0000-7000-8000-' || lpad(i::text, 12, '0'))::uuid, ('00000000-0000-4000-8000-' || lpad(i::text, 12, '0'))::uuid,
				'20000000-0000-4000-8000-000000000000', 'old', 'succeeded', 2, ?, ? ${series}`, [old, old, messages]);
		await db.raw(`INSERT INTO delivery_attempts (delivery_id, attempt, attempted_at, success, status_code, detail, duration_ms)
			SELECT ('10000000-0000-7000-8000-' || lpad((i / 2)::text, 12, '0'))::uuid, i % 2 + 1, ?, i % 2 = 1, CASE WHEN i % 2 = 1 THEN 200 ELSE 500 END, '', 10
			FROM generate_series(0, 2 * ? - 1) AS i`, [old, messages]);
		await db.raw("ANALYZE");
		return;
	}
	const series = `WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ? - 1)`;
	await db.raw(`${series} INSERT INTO delivery_messages (event_id, customer_id, user_id, type, body, occurred_at, created_at)
		SELECT printf('00000000-0000-4000-8000-%012d', i), 'old', 'old-user', 'tasking:order_status', ?, ?, ? FROM n`, [messages, body, old, old]);
	await db.raw(`${series} INSERT INTO deliveries (id, event_id, webhook_id, customer_id, status, attempt_count, created_at, updated_at)
		SELECT printf('10000000-0000-7000-8000-%012d', i), printf('00000000-0000-4000-8000-%012d', i),
			'20000000-0000-4000-8000-000000000000', 'old', 'succeeded', 2, ?, ? FROM n`, [messages, old, old]);
	await db.raw(`${series} INSERT INTO delivery_attempts (delivery_id, attempt, attempted_at, success, status_code, detail, duration_ms)
		SELECT printf('10000000-0000-7000-8000-%012d', i / 2), i % 2 + 1, ?, i % 2, CASE WHEN i % 2 = 1 THEN 200 ELSE 500 END, '', 10 FROM n`, [2 * messages, old]);
	await db.raw("ANALYZE");
	// Write the seeded pages back now, not during the first measurement.
	await db.raw("PRAGMA wal_checkpoint(TRUNCATE)");
}

async function countRows(db: Knex, table: string): Promise<number> {
	const [{ count }] = await db(table).count({ count: "*" });
	return Number(count);
}

/**
 * Sustained delivery of `count` events, at most IN_SYSTEM not yet delivered (as in the delivery
 * part): events per second from the first publish until the receiver has answered them all and
 * none of the benchmark customer's deliveries is pending.
 */
async function deliverSustained(stack: BenchApp, receiver: Receiver, count: number): Promise<number> {
	const offset = receiver.received;
	let next = 0;
	const started = performance.now();
	const publisher = async () => {
		while (next < count) {
			const i = next++;
			await receiver.waitForCount(offset + i - IN_SYSTEM + 1);
			await stack.app.broker.call("dispatcher.publish", { customer_id: "bench", user_id: "bench-user", order_id: `order-${offset + i}`, status: "fulfilled" });
		}
	};
	await Promise.all(Array.from({ length: IN_SYSTEM }, publisher));
	await receiver.waitForCount(offset + count);
	while (Number((await stack.db("deliveries").where({ customer_id: "bench", status: "pending" }).count({ count: "*" }))[0].count) > 0) await sleep(10);
	return count / ((performance.now() - started) / 1000);
}

export async function run(): Promise<object> {
	const target = await startBenchTarget();
	const { receiver, url } = target;
	let stack: BenchApp | undefined;
	try {
		stack = await startBenchApp({ ...target.dispatcherEnv, RETENTION_PERIOD: "30d" });
		await stack.app.broker.call("webhooks.create", { name: "bench", url, events: [TASKING_ORDER_STATUS_TOPIC] }, { meta: { customerId: "bench" } });
		const messages = Math.ceil(ROWS / ROWS_PER_MESSAGE);
		const seedStarted = performance.now();
		await seedOld(stack.db, messages);
		const seedSeconds = (performance.now() - seedStarted) / 1000;
		const seeded = (await countRows(stack.db, "delivery_messages")) + (await countRows(stack.db, "deliveries")) + (await countRows(stack.db, "delivery_attempts"));

		await deliverSustained(stack, receiver, 2_000); // warm-up
		const before = await deliverSustained(stack, receiver, DELIVERIES);

		const pruneStarted = performance.now();
		let pruneSeconds = 0;
		const pruning = stack.app.broker.call<Record<string, number>, object>("dispatcher.prune", {}, { timeout: 0 }).then(result => {
			pruneSeconds = (performance.now() - pruneStarted) / 1000;
			return result;
		});
		await sleep(200); // pruning under way
		const during = await deliverSustained(stack, receiver, DELIVERIES);
		const prunedWhileMeasured = pruneSeconds === 0;
		await pruning;
		const left = (await countRows(stack.db, "delivery_messages")) - (await stack.db("delivery_messages").where({ customer_id: "bench" }).count({ count: "*" }).then(([row]) => Number(row.count)));
		const after = await deliverSustained(stack, receiver, DELIVERIES);

		const ratio = during / ((before + after) / 2);
		return {
			engine: process.env.BENCH_DATABASE_URL ? "postgresql" : "sqlite",
			rows_seeded: seeded,
			seed_seconds: round(seedSeconds, 1),
			deliveries_per_measurement: DELIVERIES,
			deliveries_per_s_before: round(before),
			deliveries_per_s_during_pruning: round(during),
			deliveries_per_s_after: round(after),
			pruning_outlasted_measurement: prunedWhileMeasured,
			prune_seconds: round(pruneSeconds, 1),
			rows_pruned_per_s: round(seeded / pruneSeconds),
			old_messages_left: left,
			ratio: round(ratio, 2),
			goal_ratio: GOAL_RATIO,
			meets_goal: ratio >= GOAL_RATIO && prunedWhileMeasured && left === 0,
		};
	} finally {
		await stack?.stop();
		await target.stop();
	}
}

if (require.main === module) {
	run().then(
		result => process.stdout.write(`${JSON.stringify({ retention: result }, null, 2)}\n`),
		err => {
			process.stderr.write(`retention benchmark failed: ${err instanceof Error ? err.stack : String(err)}\n`);
			process.exit(1);
		},
	);
}
