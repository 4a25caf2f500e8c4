// Delivery benchmark (npm run bench, "delivery" part; or `tsx bench/delivery.ts` alone).
//
// 1. Raw baseline: signed Standard Webhooks POSTs with undici straight to a loopback HTTPS
//    receiver, CONCURRENCY at a time, no broker, no database.
// 2. The dispatcher: events through the real services (moleculer, intake, persistence, leases,
//    sender, result writes) to the same receiver with DELIVERY_CONCURRENCY = CONCURRENCY,
//    counted until every delivery is recorded as succeeded in the database:
//    - sustained: load matched to capacity (at most 4 × CONCURRENCY events not yet delivered);
//    - burst: every event published at once, the backlog drained through claims.
// 3. Latency from event to first attempt at half of the sustained rate (open loop).
//
// The receiver runs in a worker thread, so it has its own event loop as a real one would.
// Embedded default: SQLite under a temporary DATA_DIR; BENCH_DATABASE_URL=postgres://… measures
// PostgreSQL instead (in a throw-away schema).
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { Worker } from "node:worker_threads";
import type { Knex } from "knex";
import { Agent, request } from "undici";
import type { App } from "../app";
import { generateWebhookSecret } from "../lib/crypto";
import { signMessage } from "../lib/signing";
import { testCertificate } from "../test/helpers/https-receiver";
import { startBenchApp, type BenchApp } from "./lib/bench-app";
import { percentile, round } from "./lib/stats";

const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 64);
const DELIVERIES = Number(process.env.BENCH_DELIVERIES ?? 20_000);
const WARM_UP = 1_000;
const LATENCY_SECONDS = Number(process.env.BENCH_LATENCY_SECONDS ?? 5);
const PUBLISH_WINDOW = 1_000;
const IN_SYSTEM = 4 * CONCURRENCY;
const GOAL_RATIO = 0.5;

const epochMs = () => performance.timeOrigin + performance.now();
const sleep = (ms: number) => new Promise(resolve => setTimeout(resolve, ms));

// The receiver: answers 200 once the body is read; for bodies carrying data.sent_at it records
// the latency from the event to its arrival.
const RECEIVER_SOURCE = `
const https = require("node:https");
const { parentPort, workerData } = require("node:worker_threads");
let received = 0;
let latencies = [];
const server = https.createServer({ key: workerData.key, cert: workerData.cert, keepAliveTimeout: 30000 }, (req, res) => {
	const chunks = [];
	req.on("data", chunk => chunks.push(chunk));
	req.on("end", () => {
		const now = performance.timeOrigin + performance.now();
		received += 1;
		const body = Buffer.concat(chunks).toString("utf8");
		const at = body.indexOf('"sent_at":');
		if (at >= 0) latencies.push(now - parseFloat(body.slice(at + 10)));
		res.writeHead(200, { "content-type": "text/plain" });
		res.end("ok");
	});
});
server.listen(0, "127.0.0.1", () => parentPort.postMessage({ type: "listening", port: server.address().port }));
setInterval(() => parentPort.postMessage({ type: "count", received }), 2).unref();
parentPort.on("message", message => {
	if (message === "stats") parentPort.postMessage({ type: "stats", received, latencies });
	if (message === "reset") { received = 0; latencies = []; }
});
`;

interface ReceiverStats {
	received: number;
	latencies: number[];
}

export class Receiver {
	/** Requests answered so far, as last reported by the receiver thread (every 2 ms). */
	received = 0;
	private pendingStats: Array<(stats: ReceiverStats) => void> = [];
	private countWaiters: Array<{ count: number; resolve(): void }> = [];

	private constructor(
		private readonly worker: Worker,
		readonly port: number,
	) {
		worker.on("message", message => {
			if (message.type === "count") {
				this.received = message.received;
				const waiting = this.countWaiters;
				this.countWaiters = waiting.filter(waiter => waiter.count > this.received);
				for (const waiter of waiting) if (waiter.count <= this.received) waiter.resolve();
			}
			if (message.type === "stats") this.pendingStats.shift()?.(message);
		});
	}

	static async start(key: string, cert: string): Promise<Receiver> {
		const worker = new Worker(RECEIVER_SOURCE, { eval: true, workerData: { key, cert } });
		const port = await new Promise<number>(resolve => worker.once("message", message => resolve(message.port)));
		return new Receiver(worker, port);
	}

	stats(): Promise<ReceiverStats> {
		return new Promise(resolve => {
			this.pendingStats.push(resolve);
			this.worker.postMessage("stats");
		});
	}

	/** Resolves once the receiver has answered `count` requests. */
	waitForCount(count: number): Promise<void> {
		if (this.received >= count) return Promise.resolve();
		return new Promise(resolve => this.countWaiters.push({ count, resolve }));
	}

	reset(): void {
		this.received = 0;
		this.worker.postMessage("reset");
	}

	stop(): Promise<number> {
		return this.worker.terminate();
	}
}


function sampleBody(i: number): string {
	return JSON.stringify({
		type: "tasking:order_status",
		timestamp: new Date().toISOString(),
		data: { order_id: `order-${i}`, status: "fulfilled", previous_status: "in progress", user_id: "bench-user", order_name: "Benchmark order", priority: "standard" },
	});
}

/** Signed POSTs with undici and nothing else: the ceiling for this receiver and concurrency. */
async function rawBaseline(url: string, ca: string, count: number): Promise<number> {
	const agent = new Agent({ connections: CONCURRENCY, connect: { ca } });
	const secret = generateWebhookSecret();
	let next = 0;
	const worker = async () => {
		while (next < count) {
			const i = next++;
			const body = sampleBody(i);
			const messageId = `msg_${crypto.randomUUID()}`;
			const now = new Date();
			const response = await request(url, {
				method: "POST",
				dispatcher: agent,
				headers: {
					"content-type": "application/json",
					"webhook-id": messageId,
					"webhook-timestamp": String(Math.floor(now.getTime() / 1000)),
					"webhook-signature": signMessage(messageId, now, body, [secret]),
				},
				body,
			});
			await response.body.text();
			if (response.statusCode !== 200) throw new Error(`baseline got HTTP ${response.statusCode}`);
		}
	};
	await Promise.all(Array.from({ length: CONCURRENCY }, worker)); // warm-up
	next = 0;
	const started = performance.now();
	await Promise.all(Array.from({ length: CONCURRENCY }, worker));
	const seconds = (performance.now() - started) / 1000;
	await agent.close();
	return count / seconds;
}

async function countWhere(db: Knex, status: string): Promise<number> {
	const [{ count }] = await db("deliveries").where({ status }).count({ count: "*" });
	return Number(count);
}

/**
 * Waits until `expected` deliveries are recorded as succeeded. The receiver's count (cheap, in
 * its own thread) says when to start asking the database, so that counting rows does not compete
 * with the dispatcher for its CPU during the run.
 */
async function waitForSucceeded(db: Knex, receiver: Receiver, expected: number): Promise<number> {
	while (receiver.received < expected) await sleep(5);
	for (;;) {
		if ((await countWhere(db, "pending")) === 0 && (await countWhere(db, "succeeded")) >= expected) return performance.now();
		await sleep(10);
	}
}

/**
 * Acknowledged publishes, at most `window` outstanding. With `inSystem`, a new event is only
 * published while fewer than that many earlier ones have yet to reach the receiver: load that
 * matches what the dispatcher can deliver, instead of a backlog.
 */
async function publishMany(app: App, receiver: Receiver, count: number, offset: number, window: number, inSystem = Infinity): Promise<void> {
	let next = 0;
	const publisher = async () => {
		while (next < count) {
			const i = offset + next++;
			if (Number.isFinite(inSystem)) await receiver.waitForCount(i - inSystem + 1);
			await app.broker.call("dispatcher.publish", { customer_id: "bench", user_id: "bench-user", order_id: `order-${i}`, status: "fulfilled", order_name: "Benchmark order" });
		}
	};
	await Promise.all(Array.from({ length: Math.min(window, count) }, publisher));
}

/** The receiver thread, its URL, and the dispatcher settings that trust it (WEBHOOK_CA_FILE). */
export async function startBenchTarget(): Promise<{ receiver: Receiver; url: string; cert: string; dispatcherEnv: Record<string, string>; stop(): Promise<void> }> {
	const { key, cert } = testCertificate();
	const caDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-bench-ca-"));
	const caFile = path.join(caDir, "ca.pem");
	fs.writeFileSync(caFile, cert);
	const receiver = await Receiver.start(key, cert);
	return {
		receiver,
		url: `https://127.0.0.1:${receiver.port}/hook`,
		cert,
		dispatcherEnv: {
			SERVICES: "topics,webhooks,users,dispatcher",
			WEBHOOK_ALLOW_NETS: "127.0.0.0/8",
			WEBHOOK_CA_FILE: caFile,
			DELIVERY_CONCURRENCY: String(CONCURRENCY),
			DELIVERY_WEBHOOK_CONCURRENCY: String(CONCURRENCY),
		},
		async stop() {
			await receiver.stop();
			fs.rmSync(caDir, { recursive: true, force: true });
		},
	};
}

export async function run(): Promise<object> {
	const target = await startBenchTarget();
	const { receiver, url, cert } = target;
	let stack: BenchApp | undefined;
	try {
		// Measured before and after the dispatcher, and averaged: the machine's other load drifts.
		const baselineBefore = await rawBaseline(url, cert, DELIVERIES);

		stack = await startBenchApp(target.dispatcherEnv);
		const { app, db } = stack;
		await app.broker.call("webhooks.create", { name: "bench", url, events: ["tasking:order_status"] }, { meta: { customerId: "bench" } });
		receiver.reset();
		await publishMany(app, receiver, WARM_UP, 0, PUBLISH_WINDOW);
		await waitForSucceeded(db, receiver, WARM_UP);

		// Sustained: a bounded number of events in the system, so that intake can lease each delivery.
		let started = performance.now();
		await publishMany(app, receiver, DELIVERIES, WARM_UP, IN_SYSTEM, IN_SYSTEM);
		let finished = await waitForSucceeded(db, receiver, WARM_UP + DELIVERIES);
		const sustained = DELIVERIES / ((finished - started) / 1000);

		// Burst: every event published as fast as intake takes them, then drained from the database.
		started = performance.now();
		await publishMany(app, receiver, DELIVERIES, WARM_UP + DELIVERIES, PUBLISH_WINDOW);
		finished = await waitForSucceeded(db, receiver, WARM_UP + 2 * DELIVERIES);
		const burst = DELIVERIES / ((finished - started) / 1000);

		// Open loop at half the sustained rate, through the event path producers use (broker.emit).
		const rate = sustained / 2;
		const tickMs = 10;
		const total = Math.round(rate * LATENCY_SECONDS);
		const loadStarted = performance.now();
		let sent = 0;
		while (sent < total) {
			const due = Math.min(total, Math.floor(((performance.now() - loadStarted) / 1000) * rate));
			for (; sent < due; sent++) {
				app.broker.emit("tasking.order_status", {
					customer_id: "bench",
					user_id: "bench-user",
					order_id: `latency-${sent}`,
					status: "staged",
					details: { sent_at: epochMs() },
				});
			}
			await sleep(tickMs);
		}
		await waitForSucceeded(db, receiver, WARM_UP + 2 * DELIVERIES + total);
		const { latencies } = await receiver.stats();
		const sorted = [...latencies].sort((a, b) => a - b);
		await stack.stop();
		stack = undefined;
		const baselineAfter = await rawBaseline(url, cert, DELIVERIES);
		const baseline = (baselineBefore + baselineAfter) / 2;
		const ratio = sustained / baseline;

		return {
			engine: process.env.BENCH_DATABASE_URL ? "postgresql" : "sqlite",
			concurrency: CONCURRENCY,
			deliveries: DELIVERIES,
			raw_baseline_deliveries_per_s: round(baseline),
			raw_baseline_before_after: [round(baselineBefore), round(baselineAfter)],
			dispatcher_deliveries_per_s: round(sustained),
			ratio: round(ratio, 2),
			burst_drain_deliveries_per_s: round(burst),
			burst_ratio: round(burst / baseline, 2),
			goal_ratio: GOAL_RATIO,
			meets_goal: ratio >= GOAL_RATIO,
			latency_at_half_load: {
				events_per_s: round(rate),
				samples: sorted.length,
				p50_ms: round(percentile(sorted, 50)),
				p99_ms: round(percentile(sorted, 99)),
			},
		};
	} finally {
		await stack?.stop();
		await target.stop();
	}
}

if (require.main === module) {
	run().then(
		result => process.stdout.write(`${JSON.stringify({ delivery: result }, null, 2)}\n`),
		err => {
			process.stderr.write(`delivery benchmark failed: ${err instanceof Error ? err.stack : String(err)}\n`);
			process.exit(1);
		},
	);
}
