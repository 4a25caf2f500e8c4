// Benchmark part "api": throughput and latency of the authenticated HTTP API against a bare
// moleculer-web baseline, under the same load.
//
// Method (the fairest arrangement found for a 2-core machine):
// - each server runs in its own child process (one core), autocannon runs in this process
//   (the other core), so the load generator does not steal the server's event loop;
// - keep-alive connections, no pipelining, BENCH_CONNECTIONS (default 50) connections,
//   BENCH_DURATION_SECONDS (default 10) s per measurement after a 2 s warm-up;
// - the real stack is `npm start`'s: every service in one process, embedded SQLite, logger off,
//   rate limit raised so that it does not answer 429;
// - a customer is seeded with 25 webhooks through the API, so GET /webhooks returns a full page;
// - POST /webhooks sends a unique name and URL on every request.
// BENCH_PROFILE_DIR=<dir> runs both servers with --cpu-prof into <dir>/baseline and <dir>/stack.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseConfig, resolveSecrets } from "../lib/config";
import { mintToken } from "../lib/auth";
import { startChild } from "./lib/child";
import { measureLoad, type LoadFigures } from "./lib/load";
import { round } from "./lib/stats";
import { TASKING_ORDER_STATUS_TOPIC } from "../lib/schemas/events";

const SEEDED_WEBHOOKS = 25;
const GOAL_RATIO = 0.5;

interface Ready {
	port: number;
}

function settings() {
	const connections = Number(process.env.BENCH_CONNECTIONS ?? 50);
	const durationSeconds = Number(process.env.BENCH_DURATION_SECONDS ?? 10);
	if (!(connections >= 1 && durationSeconds >= 1)) throw new Error("BENCH_CONNECTIONS and BENCH_DURATION_SECONDS must be positive numbers");
	return { connections, durationSeconds, warmupSeconds: 2 };
}

async function seed(baseUrl: string, token: string): Promise<{ created: number; failure?: { status: number; body: string } }> {
	let created = 0;
	for (let i = 0; i < SEEDED_WEBHOOKS; i++) {
		const response = await fetch(`${baseUrl}/id/v3/webhooks`, {
			method: "POST",
			headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
			body: JSON.stringify({ name: `Seeded webhook ${i}`, url: `https://hooks.example.com/seed/${i}`, events: [TASKING_ORDER_STATUS_TOPIC] }),
		});
		if (response.status !== 201) return { created, failure: { status: response.status, body: (await response.text()).slice(0, 500) } };
		created++;
	}
	return { created };
}

const clean = (figures: LoadFigures) => figures.errors === 0 && figures.timeouts === 0 && figures.non_2xx === 0;

export async function run(): Promise<object> {
	const load = settings();
	const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-bench-api-"));
	const env = {
		NODE_ENV: "development",
		PORT: "0",
		HOST: "127.0.0.1",
		DATA_DIR: dataDir,
		SERVICES: "all",
		LOG_LEVEL: "error",
		RATE_LIMIT_PER_MINUTE: "1000000000",
		// Embedded mode, whatever this shell has configured.
		DATABASE_URL: "",
		TRANSPORTER: "",
		SMTP_URL: "",
		AUTH_JWKS_URL: "",
	};
	const config = parseConfig(env);
	resolveSecrets(config);
	const token = await mintToken(config, { sub: "bench-user", customer: "bench-customer", email: "bench@example.com", expiresIn: "2h" });

	const profileDir = process.env.BENCH_PROFILE_DIR;
	const nodeOptions = (name: string) => (profileDir ? ["--cpu-prof", `--cpu-prof-dir=${path.join(profileDir, name)}`] : []);
	const baseline = await startChild<Ready>(path.join(__dirname, "lib", "baseline-server.ts"), {}, undefined, nodeOptions("baseline"));
	const stack = await startChild<Ready>(path.join(__dirname, "lib", "api-server.ts"), env, undefined, nodeOptions("stack"));
	try {
		const baseUrl = `http://127.0.0.1:${stack.ready.port}`;
		const seeded = await seed(baseUrl, token);
		const listed = await fetch(`${baseUrl}/id/v3/webhooks`, { headers: { authorization: `Bearer ${token}` } });
		const page = (await listed.json()) as { webhooks?: unknown[] };

		process.stderr.write("bench api: baseline GET\n");
		const baselineGet = await measureLoad({ ...load, url: `http://127.0.0.1:${baseline.ready.port}/id/v3/webhooks` });
		await baseline.stop();

		process.stderr.write("bench api: authenticated GET /id/v3/webhooks\n");
		const auth = { authorization: `Bearer ${token}` };
		const listGet = await measureLoad({ ...load, url: `${baseUrl}/id/v3/webhooks`, headers: auth });

		process.stderr.write("bench api: authenticated POST /id/v3/webhooks\n");
		let created = 0;
		const createPost = await measureLoad({
			...load,
			url: `${baseUrl}/id/v3/webhooks`,
			method: "POST",
			headers: { ...auth, "content-type": "application/json" },
			body: () => {
				const n = ++created;
				return JSON.stringify({ name: `Bench ${n}`, url: `https://hooks.example.com/bench/${n}`, events: [TASKING_ORDER_STATUS_TOPIC] });
			},
		});

		const ratio = baselineGet.requests_per_second > 0 ? round(listGet.requests_per_second / baselineGet.requests_per_second, 3) : null;
		return {
			method: {
				server: "child process, all services, embedded SQLite (WAL), logger off",
				baseline: "child process, bare moleculer-web + one action returning a constant page of 25 webhooks; no auth, no DB",
				load_generator: "autocannon in the parent process, keep-alive, pipelining 1",
				connections: load.connections,
				duration_seconds: load.durationSeconds,
				warmup_seconds: load.warmupSeconds,
				node: process.version,
				cpus: os.cpus().length,
			},
			seed: {
				webhooks_created: seeded.created,
				list_page_size: Array.isArray(page.webhooks) ? page.webhooks.length : null,
				...(seeded.failure ? { failure: seeded.failure } : {}),
			},
			baseline_get: baselineGet,
			list_get: { ...listGet, clean: clean(listGet) },
			create_post: { ...createPost, clean: clean(createPost) },
			ratio_list_to_baseline: ratio,
			goal_ratio: GOAL_RATIO,
			goal_met: ratio !== null && ratio >= GOAL_RATIO,
		};
	} finally {
		await Promise.all([baseline.stop(), stack.stop()]);
		fs.rmSync(dataDir, { recursive: true, force: true });
	}
}
