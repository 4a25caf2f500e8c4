// A delivery benchmark stopped by Ctrl-C or SIGTERM in the middle of a run leaves nothing on the
// shared servers: its service processes stop, and its PostgreSQL schemas and JetStream streams,
// which the run's own steps remove only as they finish, are removed before it exits. Nor does it
// leave the transpiled copy its child processes run from (bench/lib/child.ts): here it makes its
// own, as outside the suite, instead of taking the run's.
import { setTimeout as sleep } from "node:timers/promises";
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import knex, { type Knex } from "knex";
import { connect, type NatsConnection } from "nats";
import { TEST_DATABASE_URL, TEST_NATS_URL } from "./helpers/services";

const ROOT = path.join(__dirname, "..");

async function schemasOf(db: Knex, runId: string): Promise<string[]> {
	const { rows } = await db.raw<{ rows: Array<{ nspname: string }> }>("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, ?)", [`bench_${runId}`]);
	return rows.map(row => row.nspname);
}

async function streamsOf(nats: NatsConnection, runId: string): Promise<string[]> {
	const names: string[] = [];
	for await (const stream of (await nats.jetstreamManager()).streams.list()) if (stream.config.name.startsWith(runId)) names.push(stream.config.name);
	return names;
}

/** The service processes of the run still alive: their NODE_ID starts with the run's id. */
function processesOf(runId: string): number[] {
	return fs
		.readdirSync("/proc")
		.filter(entry => /^\d+$/.test(entry))
		.filter(pid => {
			try {
				return fs.readFileSync(`/proc/${pid}/environ`, "utf8").split("\0").some(variable => variable.startsWith(`NODE_ID=${runId}`));
			} catch {
				return false; // gone meanwhile, or not ours to read
			}
		})
		.map(Number);
}

describe("npm run bench -- delivery, stopped by a signal", () => {
	let db: Knex;
	let nats: NatsConnection;

	beforeAll(async () => {
		db = knex({ client: "pg", connection: TEST_DATABASE_URL, pool: { min: 0, max: 1 } });
		nats = await connect({ servers: new URL(TEST_NATS_URL).host });
	});

	afterAll(async () => {
		await nats.close();
		await db.destroy();
	});

	it.each(["SIGINT", "SIGTERM"] as const)("on %s stops its processes, removes its schemas and streams, and exits 128 + the signal's number", async signal => {
		// The PostgreSQL scenario alone: a floor, the relay, then a one-node deployment on a schema
		// and a stream of its own, where the signal comes. The floor is cut to a few hundred POSTs:
		// its 25,000 were a third of this suite's CPU, spent before the part under test.
		const bench = spawn(process.execPath, ["--import", "tsx", "bench/index.ts", "delivery"], {
			cwd: ROOT,
			env: { ...process.env, BENCH_TRANSPILED_COPY: "", BENCH_SCENARIOS: "postgresql", BENCH_FLOOR_REQUESTS: "400", BENCH_EVENTS: "50", BENCH_LATENCY_ROUNDS: "1", BENCH_DATABASE_URL: TEST_DATABASE_URL, BENCH_NATS_URL: TEST_NATS_URL },
			stdio: ["ignore", "pipe", "pipe"],
		});
		let stderr = "";
		bench.stderr.on("data", chunk => (stderr += String(chunk)));
		const exited = new Promise<number | null>(resolve => bench.once("exit", code => resolve(code)));
		let runId: string | undefined;
		try {
			const deadline = Date.now() + 120_000;
			while (!runId || (await schemasOf(db, runId)).length === 0 || (await streamsOf(nats, runId)).length === 0) {
				if (Date.now() > deadline || bench.exitCode !== null) throw new Error(`the run made no schema and stream to stop it in:\n${stderr}`);
				runId ??= /run (b[0-9a-f]{6}): /.exec(stderr)?.[1];
				await sleep(100);
			}
			expect(processesOf(runId).length).toBeGreaterThan(0);
			const copy = /the child processes run from (\S+), transpiled/.exec(stderr)?.[1];
			expect(copy && fs.existsSync(path.join(copy, "bench", "lib", "service-node.js"))).toBe(true);

			bench.kill(signal);
			expect(await exited).toBe(signal === "SIGINT" ? 130 : 143);
			expect(stderr).toContain(`bench delivery: ${signal}: stopping the run's processes, removing its schemas and streams`);
			expect({ schemas: await schemasOf(db, runId), streams: await streamsOf(nats, runId), processes: processesOf(runId), copyLeft: fs.existsSync(copy!) }).toEqual({
				schemas: [],
				streams: [],
				processes: [],
				copyLeft: false,
			});
		} finally {
			if (bench.exitCode === null && bench.signalCode === null) {
				bench.kill("SIGKILL");
				await exited;
			}
			// What a failed run left: this test's to remove, not the shared servers' to keep.
			if (runId) {
				for (const schema of await schemasOf(db, runId)) await db.raw(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
				const manager = await nats.jetstreamManager();
				for (const stream of await streamsOf(nats, runId)) await manager.streams.delete(stream);
			}
		}
	}, 180_000);
});
