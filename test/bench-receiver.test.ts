// The delivery benchmark's receivers (bench/lib/receiver.ts), as its scenarios use them: throughput
// and latency are what this process counts, so each kind of endpoint must answer and count as
// documented, and a path must pick the behaviour, so that webhooks of one host can differ (the
// bad-neighbour scenario's one-host layout). Real HTTPS requests to the child process.
import { setTimeout as sleep } from "node:timers/promises";
import https from "node:https";
import path from "node:path";
import { startChild } from "../bench/lib/child";
import { probe } from "../bench/lib/cluster-nodes";
import { behaviourOf, SLOW_MS, type ReceiverReady } from "../bench/lib/receiver";
import { Receivers } from "../bench/lib/receivers";
import { testCertificate } from "./helpers/https-receiver";

describe("behaviourOf", () => {
	it("takes the kind a path names, and the endpoint's own kind for any other path", () => {
		expect(behaviourOf("ok", "/slow?ms=2000")).toEqual({ kind: "slow", slowMs: 2000 });
		expect(behaviourOf("ok", "/slow")).toEqual({ kind: "slow", slowMs: SLOW_MS });
		expect(behaviourOf("ok", "/fail")).toEqual({ kind: "fail", slowMs: SLOW_MS });
		expect(behaviourOf("fail", "/quiet?n=2")).toEqual({ kind: "quiet", slowMs: SLOW_MS });
		expect(behaviourOf("slow", "/p3")).toEqual({ kind: "slow", slowMs: SLOW_MS });
		expect(behaviourOf("ok", "/slowly")).toEqual({ kind: "ok", slowMs: SLOW_MS });
		expect(behaviourOf("ordered", "/hook")).toEqual({ kind: "ordered", slowMs: SLOW_MS });
	});

	it("ignores a delay that is not a positive number", () => {
		for (const ms of ["abc", "-5", "0", ""]) expect(behaviourOf("ok", `/slow?ms=${ms}`)).toEqual({ kind: "slow", slowMs: SLOW_MS });
	});
});

describe("the benchmark's receivers", () => {
	const { key, cert } = testCertificate();
	let receivers: Receivers;
	let okPort: number;

	beforeAll(async () => {
		receivers = new Receivers(await startChild<ReceiverReady>(path.join(__dirname, "../bench/lib/receiver.ts"), { RECEIVER_ENDPOINTS: "ok,slow", RECEIVER_KEY: key, RECEIVER_CERT: cert }));
		[okPort] = receivers.ports;
	});
	afterAll(() => receivers?.stop());

	const post = (port: number, pathAndQuery: string, messageId: string, body: string) =>
		new Promise<{ status: number; ms: number }>((resolve, reject) => {
			const started = Date.now();
			const request = https.request({ host: "127.0.0.1", port, path: pathAndQuery, method: "POST", ca: cert, servername: "localhost", headers: { "webhook-id": messageId, "content-type": "application/json" } }, response => {
				response.resume();
				response.on("end", () => resolve({ status: response.statusCode ?? 0, ms: Date.now() - started }));
			});
			request.on("error", reject);
			request.end(body);
		});
	const counts = () => ({ ok: receivers.ok, repeats: receivers.repeats, slow: receivers.slow, fail: receivers.fail, quiet: receivers.quiet });
	const countsReach = async (expected: ReturnType<typeof counts>) => {
		while (JSON.stringify(counts()) !== JSON.stringify(expected)) await sleep(5);
	};

	it("answers and counts each kind as its path picks it, and keeps latency samples of healthy endpoints only", async () => {
		const sentAt = 12.5;
		expect((await post(okPort, "/p1", "m1", JSON.stringify({ data: { sent_at: sentAt } }))).status).toBe(200);
		expect((await post(okPort, "/p1", "m1", "{}")).status).toBe(200);
		expect((await post(okPort, "/quiet?n=1", "m2", JSON.stringify({ data: { sent_at: sentAt } }))).status).toBe(200);
		expect((await post(okPort, "/fail", "m3", "{}")).status).toBe(500);
		const slow = await post(okPort, "/slow?ms=300", "m4", "{}");
		expect(slow.status).toBe(200);
		// The delay asked for took effect (SLOW_MS is 100): a lower bound a timer cannot undercut, not a speed.
		expect(slow.ms).toBeGreaterThan(2 * SLOW_MS);
		await countsReach({ ok: 1, repeats: 1, slow: 1, fail: 1, quiet: 1 });

		const samples = await receivers.samples();
		expect(samples).toHaveLength(1);
		expect(samples[0][0]).toBe(sentAt);
	});

	// bench/lib/event-loop-probe.ts, which every benchmark child runs: a window opened for CPU alone
	// runs without the 1 ms delay monitor, and the next window watching the loop has it back. Node
	// records the time between the monitor's firings, so a watched window reads at least 1 ms.
	it("measures a CPU-only window without its event-loop monitor, and watches the loop again after", async () => {
		const pause = () => sleep(100);
		await probe(receivers.child, "cpu");
		await pause();
		const cpuOnly = await probe(receivers.child);
		expect(cpuOnly).toMatchObject({ delay_p50_ms: 0, delay_max_ms: 0 });
		expect(cpuOnly.cpu_cores).toBeGreaterThanOrEqual(0);
		await pause();
		const watched = await probe(receivers.child);
		expect(watched.delay_p50_ms).toBeGreaterThanOrEqual(1);
	});

	it("keeps an endpoint's own kind on any other path", async () => {
		const before = counts();
		const [, slowPort] = receivers.ports;
		expect((await post(slowPort, "/p2", "m5", "{}")).status).toBe(200);
		await countsReach({ ...before, slow: before.slow + 1 });
	});
});
