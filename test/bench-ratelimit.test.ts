// `npm run bench -- delivery` with BENCH_SCENARIOS=ratelimit, as docs/benchmarks.md describes it, at a
// tiny size: one round of each mode on SQLite. Figures are machine-dependent, so only their shape
// is checked, and that the receivers answered 200 to every delivery, limited or not, exactly once
// (the scenario itself marks a round that lost anything invalid).
import { execFile } from "node:child_process";
import path from "node:path";
import { promisify } from "node:util";
import type { BurstFigures as Burst } from "../bench/lib/rate-limit";

const run = promisify(execFile);

describe("npm run bench -- delivery, ratelimit scenario", () => {
	it("prints the unlimited webhooks' rate with a limited one beside them and without, and the limited one's rate and busiest second, nothing lost", async () => {
		const { stdout } = await run("npm", ["run", "-s", "bench", "--", "delivery"], {
			cwd: path.join(__dirname, ".."),
			env: { ...process.env, BENCH_SCENARIOS: "ratelimit", BENCH_EVENTS: "50", BENCH_RATELIMIT_EVENTS: "20", BENCH_RATELIMIT_LIMIT: "20", BENCH_RATELIMIT_ROUNDS: "1" },
			maxBuffer: 1 << 20,
		});
		const { delivery } = JSON.parse(stdout) as {
			delivery: {
				error?: string;
				ratelimit: {
					limit: number;
					events_per_webhook: number;
					unlimited_webhooks: number;
					rounds: number;
					goals: Record<string, number>;
					sqlite: { valid: boolean; unlimited_with_vs_without: number | null; limited_achieved_vs_limit: number[]; limited_busiest_second_vs_limit: number[]; rounds: { without: Burst[]; with: Burst[] } };
				};
			};
		};
		expect(delivery.error).toBeUndefined();
		const { ratelimit } = delivery;
		expect({ limit: ratelimit.limit, events: ratelimit.events_per_webhook, webhooks: ratelimit.unlimited_webhooks, rounds: ratelimit.rounds }).toEqual({ limit: 20, events: 20, webhooks: 10, rounds: 1 });
		expect(ratelimit.goals).toEqual({ unlimited_with_vs_without: 0.9, limited_busiest_second_vs_limit_at_most: 1.1 });
		const { sqlite } = ratelimit;
		expect(sqlite.valid).toBe(true);
		expect(sqlite.unlimited_with_vs_without).toBeGreaterThan(0);
		expect(sqlite.rounds.without).toHaveLength(1);
		expect(sqlite.rounds.with).toHaveLength(1);
		for (const burst of [...sqlite.rounds.without, ...sqlite.rounds.with]) {
			expect(burst).toMatchObject({ unlimited_deliveries: 200, received: 200, lost: 0, repeats: 0, failed_sends: 0, valid: true });
			expect(burst.unlimited_deliveries_per_s).toBeGreaterThan(0);
		}
		expect(sqlite.rounds.without[0].limited).toBeUndefined();
		const limited = sqlite.rounds.with[0].limited!;
		expect(limited).toMatchObject({ deliveries: 20, received: 20, lost: 0, repeats: 0, rows_not_succeeded_first_time: 0 });
		expect(limited.busiest_second).toBeGreaterThan(0);
		expect(sqlite.limited_achieved_vs_limit).toEqual([limited.achieved_vs_limit]);
		expect(sqlite.limited_busiest_second_vs_limit).toEqual([limited.busiest_second_vs_limit]);
	}, 300_000);
});
