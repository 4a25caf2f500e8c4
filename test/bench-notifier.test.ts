// `npm run bench -- notifier`, as docs/benchmarks.md shows it: one JSON document on standard output, with
// the CPU an email-worthy event of a user who never turned email on costs each process. Figures
// are machine-dependent, so only their shape is checked, and that no such event left an outbox row.
import { execFile } from "node:child_process";
import path from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

describe("npm run bench -- notifier", () => {
	it("prints one JSON document with the CPU per event of the notifier, PostgreSQL and the rest", async () => {
		const { stdout } = await run("npm", ["run", "-s", "bench", "--", "notifier"], {
			cwd: path.join(__dirname, ".."),
			env: { ...process.env, BENCH_NOTIFIER_EVENTS: "200" },
			maxBuffer: 1 << 20,
		});
		const { notifier } = JSON.parse(stdout) as {
			notifier: { error?: string; events: number; events_per_s: number; cpu_us_per_event: Record<string, number>; goal_us_per_event: number; outbox_rows: Record<string, number> };
		};
		expect(notifier.error).toBeUndefined();
		expect(notifier.events).toBe(200);
		expect(notifier.events_per_s).toBeGreaterThan(0);
		for (const part of ["notifier", "postgres", "notifier_and_postgres", "users", "nats_server"]) expect(notifier.cpu_us_per_event[part]).toBeGreaterThanOrEqual(0);
		expect(notifier.cpu_us_per_event.notifier).toBeGreaterThan(0);
		expect(notifier.goal_us_per_event).toBe(100);
		expect(notifier.outbox_rows).toEqual({});
	}, 180_000);
});
