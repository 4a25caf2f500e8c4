// A webhook receiver in a worker thread of the benchmark's own process, and the dispatcher
// settings that trust it: what bench/retention.ts measures its delivery rate against.
// (bench/delivery.ts runs its receivers in a process of their own, bench/lib/receiver.ts.)
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Worker } from "node:worker_threads";
import { testCertificate } from "../../test/helpers/https-receiver";

const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 64);

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
