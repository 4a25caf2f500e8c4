// Sender benchmark (`npm run bench -- sender`): what one webhook attempt costs the service's own
// HTTP client, against the delivery benchmark's floor (the plainest signed undici POST), in the
// same run, against the same receivers in a process of their own. No broker, no database: this
// isolates lib/webhook-sender.ts (in-process, as DELIVERY_SENDER_THREADS=0 uses it) and the
// threaded sender (lib/threaded-sender.ts, the default), whose CPU includes the hop between the
// threads. Each runs REQUESTS attempts (BENCH_SENDER_REQUESTS), CONCURRENCY at a time spread over the endpoints, after a
// warm-up; CPU is the whole process's (user + system) per request.
//
// Only answers of 200 count: each measurement checks every attempt's own status and the
// receivers' count of distinct message ids answered 200, and a run with any failed attempt or
// any message the receivers did not count fails, instead of passing failures off as throughput.
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Agent } from "undici";
import { generateWebhookSecret } from "../lib/crypto";
import { ThreadedWebhookSender } from "../lib/threaded-sender";
import { WebhookSender, type DeliveryRequest } from "../lib/webhook-sender";
import { testCertificate } from "../test/helpers/https-receiver";
import { startChild } from "./lib/child";
import type { ReceiverReady } from "./lib/receiver";
import { Receivers } from "./lib/receivers";
import { concurrentLoops, floorBody, signedPost } from "./lib/signed-post";
import { secretKeyOf } from "../lib/signing";
import { round } from "./lib/stats";

const CONCURRENCY = 64;
const ENDPOINTS = 10;
const REQUESTS = Number(process.env.BENCH_SENDER_REQUESTS ?? 20_000);
if (!(Number.isInteger(REQUESTS) && REQUESTS >= 4)) throw new Error("BENCH_SENDER_REQUESTS must be a whole number of at least 4");
const WARM_UP_REQUESTS = Math.floor(REQUESTS / 4);
const PER_ORIGIN = 8; // DELIVERY_WEBHOOK_CONCURRENCY's default
// Counts reach this process a few milliseconds after the answers; past this, they are missing.
const RECEIVER_COUNT_WAIT_MS = 5_000;

interface Figures {
	requests: number;
	/** Distinct message ids the receivers answered 200, by their own count. */
	answered: number;
	requests_per_s: number;
	cpu_us_per_request: number;
}

/** Runs `attempt` REQUESTS times after a warm-up; every attempt must come back 200 and be counted by the receivers. */
async function measure(receivers: Receivers, urls: string[], attempt: (url: string, i: number) => Promise<boolean>): Promise<Figures> {
	let failed = 0;
	const counted = async (url: string, i: number) => {
		if (!(await attempt(url, i))) failed += 1;
	};
	const warmUpFrom = receivers.ok;
	await concurrentLoops(urls, WARM_UP_REQUESTS, CONCURRENCY, counted); // warm-up: connections, JIT
	await receivers.waitForOk(warmUpFrom + WARM_UP_REQUESTS, RECEIVER_COUNT_WAIT_MS);
	const answeredBefore = receivers.ok;
	const cpu = process.cpuUsage();
	const started = performance.now();
	await concurrentLoops(urls, REQUESTS, CONCURRENCY, counted);
	const seconds = (performance.now() - started) / 1000;
	const used = process.cpuUsage(cpu);
	await receivers.waitForOk(answeredBefore + REQUESTS, RECEIVER_COUNT_WAIT_MS);
	const answered = receivers.ok - answeredBefore;
	if (failed > 0 || answered !== REQUESTS) throw new Error(`${failed} attempts did not get a 200, and the receivers answered ${answered} of ${REQUESTS} distinct messages: the run is invalid`);
	return { requests: REQUESTS, answered, requests_per_s: Math.round(REQUESTS / seconds), cpu_us_per_request: round((used.user + used.system) / REQUESTS, 1) };
}

export async function run(): Promise<object> {
	const { key, cert } = testCertificate();
	const caFile = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "swh-bench-ca-")), "ca.pem");
	fs.writeFileSync(caFile, cert);
	const receivers = new Receivers(await startChild<ReceiverReady>(path.join(__dirname, "lib", "receiver.ts"), { RECEIVER_ENDPOINTS: Array(ENDPOINTS).fill("ok").join(","), RECEIVER_KEY: key, RECEIVER_CERT: cert }));
	const urls = receivers.ports.map(port => `https://127.0.0.1:${port}/hook`);
	const secret = generateWebhookSecret();
	const request = (url: string, i: number): DeliveryRequest => ({ url, messageId: `msg_${crypto.randomUUID()}`, body: floorBody(i), secrets: [secret], timeoutMs: 15_000 });
	const senderOptions = { allowNets: ["127.0.0.0/8"], caFile, connectionsPerOrigin: PER_ORIGIN };
	try {
		const agent = new Agent({ connections: PER_ORIGIN, connect: { ca: cert } });
		const targets = new Map(urls.map(url => [url, { url, key: secretKeyOf(secret) }]));
		const floor = await measure(receivers, urls, async (url, i) => (await signedPost(agent, targets.get(url)!, Buffer.from(floorBody(i)))) === 200);
		await agent.close();

		const inProcess = new WebhookSender(senderOptions);
		const direct = await measure(receivers, urls, async (url, i) => (await inProcess.send(request(url, i))).success);
		await inProcess.close();

		const threaded = new ThreadedWebhookSender({ ...senderOptions, threads: 1 });
		await threaded.start();
		const viaThread = await measure(receivers, urls, async (url, i) => (await threaded.send(request(url, i))).success);
		await threaded.close();

		const ratio = (figures: Figures) => ({ ...figures, cpu_vs_floor: round(figures.cpu_us_per_request / floor.cpu_us_per_request) });
		return { concurrency: CONCURRENCY, endpoints: ENDPOINTS, requests: REQUESTS, floor, in_process: ratio(direct), threaded: ratio(viaThread) };
	} finally {
		await receivers.stop();
	}
}
