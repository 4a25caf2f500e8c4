// The ordering scenario of `npm run bench -- delivery`, run as docs/benchmarks.md shows it, at a tiny
// size, on SQLite and PostgreSQL: one JSON document with every figure the issue asks for, and
// nothing lost at the receivers. Statuses out of order are counted there and printed, not judged
// here (the order tests judge them). Figures are machine-dependent, so only their shape is
// checked. The bad neighbour runs its variant whose stuck heads fail once and then wait (retries
// past the end of the run), and its healthy orders must all arrive after the set-up; the variant
// with retries due all run long may stall the webhook behind its breaker, which is what the
// benchmark is there to show, not a test's to forbid.
import { execFile } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);
const ROOT = path.join(__dirname, "..");
// One more than the breaker opens after (BREAKER.openAfter), so that it still opens during the
// set-up; each head past that waits for the breaker's probe, one a second.
const STUCK = 6;

interface Run {
	deliveries: number;
	received: number;
	lost: number;
	out_of_order: number;
	valid: boolean;
	deliveries_per_s: number | null;
}

interface EngineFigures {
	per_order_vs_none: { none: { bursts: Run[]; closed_loops: Run[] }; per_order: { bursts: Run[]; closed_loops: Run[] }; burst_ratio: number; closed_loop_ratio: number };
	five_statuses_vs_distinct: { five_statuses: { bursts: Run[] }; ratio: number };
	claims_with_waiting: { waiting: number; with: { bursts: Run[] }; claim_ratio: number | null; burst_rate_ratio: number };
	bad_neighbour: {
		without: { throughput: Run; latency: { lost: number; p99_ms: number | null } };
		variants: Array<{
			stuck_retry_every_ms: number;
			with: { stuck_heads_attempted: number; waiting_rows: number; stuck_heads_still_pending: number; throughput: Run; latency: { lost: number; p99_ms: number | null }; breaker: { opened: boolean; longest_failure_run: number } };
			throughput_with_vs_without: number;
			p99_with_vs_without: number;
			breaker_opened: boolean;
		}>;
	};
}

/** The sh block of docs/benchmarks.md that runs the scenario. */
function documentedCommand(): string {
	const doc = fs.readFileSync(path.join(ROOT, "docs", "benchmarks.md"), "utf8");
	const [command] = [...doc.matchAll(/```sh\n([\s\S]*?)```/g)].map(match => match[1].trim()).filter(block => block.includes("BENCH_SCENARIOS=ordering"));
	return command;
}

describe("npm run bench -- delivery, the ordering scenario", () => {
	it("prints every ordering figure, on both engines, with nothing lost", async () => {
		const { stdout } = await run("sh", ["-c", documentedCommand()], {
			cwd: ROOT,
			env: {
				...process.env,
				BENCH_ORDERING_WEBHOOKS: "2",
				BENCH_ORDERING_BURST: "100",
				BENCH_ORDERING_ROUNDS: "1",
				BENCH_ORDERING_CLOSED_EVENTS: "20",
				BENCH_ORDERING_WAITING: "1000",
				BENCH_ORDERING_WAITING_QUEUES: "50",
				BENCH_ORDERING_STUCK: String(STUCK),
				BENCH_ORDERING_STUCK_RETRY_MS: "600000",
				BENCH_ORDERING_NEIGHBOUR_EVENTS: "50",
				BENCH_ORDERING_LATENCY_SECONDS: "1",
			},
			maxBuffer: 1 << 24,
		});
		const { delivery } = JSON.parse(stdout) as { delivery: { error?: string; floor?: unknown; ordering: Record<"sqlite" | "postgresql", EngineFigures> & { goals: Record<string, unknown> } } };
		expect(delivery.error).toBeUndefined();
		// Run alone, the scenario measures no floor: its figures are ratios within itself.
		expect(delivery.floor).toBeUndefined();
		expect(Object.keys(delivery.ordering.goals)).toEqual(expect.arrayContaining(["per_order_vs_none", "five_statuses_vs_distinct", "neighbour_throughput_with_vs_without", "neighbour_p99_with_vs_without"]));
		for (const engine of ["sqlite", "postgresql"] as const) {
			const figures = delivery.ordering[engine];
			const runs = [
				...figures.per_order_vs_none.none.bursts,
				...figures.per_order_vs_none.none.closed_loops,
				...figures.per_order_vs_none.per_order.bursts,
				...figures.per_order_vs_none.per_order.closed_loops,
				...figures.five_statuses_vs_distinct.five_statuses.bursts,
				...figures.claims_with_waiting.with.bursts,
				figures.bad_neighbour.without.throughput,
				...figures.bad_neighbour.variants.map(variant => variant.with.throughput),
			];
			for (const measured of runs) {
				expect(measured).toMatchObject({ lost: 0, valid: true });
				// Counted, not judged here: the order tests judge it (docs/benchmarks.md has what the scenario saw on PostgreSQL).
				expect(measured.out_of_order).toBeGreaterThanOrEqual(0);
				expect(measured.received).toBe(measured.deliveries);
				expect(measured.deliveries_per_s).toBeGreaterThan(0);
			}
			expect(figures.per_order_vs_none.burst_ratio).toBeGreaterThan(0);
			expect(figures.per_order_vs_none.closed_loop_ratio).toBeGreaterThan(0);
			expect(figures.five_statuses_vs_distinct.ratio).toBeGreaterThan(0);
			expect(figures.claims_with_waiting.waiting).toBe(1000);
			expect(figures.claims_with_waiting.burst_rate_ratio).toBeGreaterThan(0);
			// Bursts this small may be leased straight to the worker, with no claim to time.
			expect(figures.claims_with_waiting).toHaveProperty("claim_ratio");
			expect(figures.bad_neighbour.without.latency.lost).toBe(0);
			expect(figures.bad_neighbour.without.latency.p99_ms).toBeGreaterThan(0);
			const [variant] = figures.bad_neighbour.variants;
			expect(variant.stuck_retry_every_ms).toBe(600_000);
			expect(variant.with).toMatchObject({ stuck_heads_attempted: STUCK, waiting_rows: STUCK * 4, stuck_heads_still_pending: STUCK });
			expect(variant.with.latency.lost).toBe(0);
			expect(variant.with.latency.p99_ms).toBeGreaterThan(0);
			expect(variant.throughput_with_vs_without).toBeGreaterThan(0);
			expect(variant.p99_with_vs_without).toBeGreaterThan(0);
			expect(typeof variant.breaker_opened).toBe("boolean");
			expect(variant.breaker_opened).toBe(variant.with.breaker.longest_failure_run >= 5);
		}
	}, 900_000);
});
