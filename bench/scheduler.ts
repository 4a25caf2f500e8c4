// Scheduler benchmark (npm run bench, "scheduler" part; or `tsx bench/scheduler.ts` alone).
//
// Claiming due deliveries must not slow down as future work piles up. For each size, seed that
// many pending deliveries due in the future (1 minute to 6 hours ahead, 1,000 messages × 1,000
// webhooks), plus one batch of due ones, then time the dispatcher's real claim statement
// (claimBatch: the leasing UPDATE … RETURNING and the body fetch) on that batch, many times.
// Goal: the 1,000,000 case within 2x of the 1,000 case, and the process RSS under 300 MB.
//
// Embedded default: SQLite under a temporary DATA_DIR; BENCH_DATABASE_URL=postgres://… measures
// PostgreSQL instead (in a throw-away schema).
import { performance } from "node:perf_hooks";
import type { Knex } from "knex";
import { startBenchApp } from "./lib/bench-app";
import { percentile, round } from "./lib/stats";
import { isPostgres } from "../mixins/db.mixin";
import { TASKING_ORDER_STATUS_TOPIC } from "../lib/schemas/events";

const SIZES = (process.env.BENCH_SCHEDULER_SIZES ?? "1000,1000000").split(",").map(Number);
const BATCH = 128; // a claim batch of the size the scheduler goal was set for (half of what one dispatcher may hold: 64 × 4)
const ROUNDS = 30;
const GOAL_RATIO = 2;
const GOAL_RSS_MB = 300;

interface ClaimingService {
	db: Knex;
	claimBatch(limit: number): Promise<{ leased: unknown[] }>;
}

/** Inserts `count` future deliveries (and their messages) in the database itself. */
async function seedFuture(db: Knex, count: number): Promise<void> {
	const now = new Date().toISOString();
	const messages = Math.min(1_000, count);
	const webhooks = Math.ceil(count / messages);
	const messageRows = Array.from({ length: messages }, (_, i) => ({
		event_id: `00000000-0000-4000-8000-${String(i).padStart(12, "0")}`,
		customer_id: "bench",
		user_id: "bench-user",
		type: TASKING_ORDER_STATUS_TOPIC,
		body: JSON.stringify({ type: TASKING_ORDER_STATUS_TOPIC, timestamp: now, data: { order_id: `order-${i}`, status: "fulfilled", user_id: "bench-user" } }),
		occurred_at: now,
		created_at: now,
	}));
	for (let i = 0; i < messageRows.length; i += 200) await db("delivery_messages").insert(messageRows.slice(i, i + 200));

	const columns = "id, event_id, webhook_id, customer_id, status, next_attempt_at, created_at, updated_at";
	if (isPostgres(db)) {
		await db.raw(
			`INSERT INTO deliveries (${columns})
			SELECT ('10000000-0000-7000-8000-' || lpad(i::text, 12, '0'))::uuid,
				('00000000-0000-4000-8000-' || lpad((i % ?)::text, 12, '0'))::uuid,
				('20000000-0000-4000-8000-' || lpad((i / ?)::text, 12, '0'))::uuid,
				'bench', 'pending',
				to_char((now() AT TIME ZONE 'UTC') + make_interval(secs => 60 + i % 21540), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
				?, ?
			FROM generate_series(0, ? - 1) AS i`,
			[messages, messages, now, now, count],
		);
		await db.raw("ANALYZE deliveries");
	} else {
		await db.raw(
			`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ? - 1)
			INSERT INTO deliveries (${columns})
			SELECT printf('10000000-0000-7000-8000-%012d', i),
				printf('00000000-0000-4000-8000-%012d', i % ?),
				printf('20000000-0000-4000-8000-%012d', i / ?),
				'bench', 'pending',
				strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+' || (60 + i % 21540) || ' seconds'),
				?, ?
			FROM n`,
			[count, messages, messages, now, now],
		);
		await db.raw("ANALYZE");
	}
	if (webhooks * messages < count) throw new Error("seeding arithmetic is off");
}

/** One batch of deliveries that are due; returns their ids so each round can make them due again. */
async function seedDue(db: Knex): Promise<string[]> {
	const now = new Date().toISOString();
	const ids = Array.from({ length: BATCH }, (_, i) => `30000000-0000-7000-8000-${String(i).padStart(12, "0")}`);
	await db("deliveries").insert(
		ids.map((id, i) => ({
			id,
			event_id: "00000000-0000-4000-8000-000000000000",
			webhook_id: `40000000-0000-4000-8000-${String(i).padStart(12, "0")}`,
			customer_id: "bench",
			status: "pending",
			next_attempt_at: new Date(Date.now() - 1_000 - i).toISOString(),
			created_at: now,
			updated_at: now,
		})),
	);
	return ids;
}

async function measure(size: number): Promise<{ pending_future: number; claimed_per_round: number; median_ms: number; p90_ms: number; seed_s: number }> {
	// The poll loop must stay out of the way: the benchmark claims by hand.
	const { app, stop } = await startBenchApp({ SERVICES: "dispatcher", DELIVERY_POLL_INTERVAL: "1h" });
	try {
		const dispatcher = app.broker.getLocalService("dispatcher") as unknown as ClaimingService;
		const seedStarted = performance.now();
		await seedFuture(dispatcher.db, size);
		const dueIds = await seedDue(dispatcher.db);
		const seedSeconds = (performance.now() - seedStarted) / 1000;

		const timings: number[] = [];
		let claimed = 0;
		for (let round = 0; round < ROUNDS + 3; round++) {
			await dispatcher.db("deliveries").whereIn("id", dueIds).update({ lease_id: null, next_attempt_at: new Date(Date.now() - 1_000).toISOString() });
			const started = performance.now();
			const batch = await dispatcher.claimBatch(BATCH);
			const elapsed = performance.now() - started;
			if (round >= 3) timings.push(elapsed); // the first rounds warm caches up
			claimed = batch.leased.length;
		}
		if (claimed !== BATCH) throw new Error(`claimed ${claimed} of ${BATCH} due deliveries`);
		return { pending_future: size, claimed_per_round: claimed, median_ms: round(percentile(timings, 50), 3), p90_ms: round(percentile(timings, 90), 3), seed_s: round(seedSeconds, 1) };
	} finally {
		await stop();
	}
}

export async function run(): Promise<object> {
	const runs = [];
	let peakRss = 0;
	for (const size of SIZES) {
		runs.push(await measure(size));
		peakRss = Math.max(peakRss, process.memoryUsage().rss);
	}
	const small = runs[0];
	const large = runs[runs.length - 1];
	const ratio = large.median_ms / small.median_ms;
	const rssMb = peakRss / (1024 * 1024);
	return {
		engine: process.env.BENCH_DATABASE_URL ? "postgresql" : "sqlite",
		batch: BATCH,
		rounds: ROUNDS,
		runs,
		ratio: round(ratio),
		goal_ratio: GOAL_RATIO,
		rss_mb: round(rssMb, 0),
		goal_rss_mb: GOAL_RSS_MB,
		meets_goal: ratio <= GOAL_RATIO && rssMb < GOAL_RSS_MB,
	};
}

if (require.main === module) {
	run().then(
		result => process.stdout.write(`${JSON.stringify({ scheduler: result }, null, 2)}\n`),
		err => {
			process.stderr.write(`scheduler benchmark failed: ${err instanceof Error ? err.stack : String(err)}\n`);
			process.exit(1);
		},
	);
}
