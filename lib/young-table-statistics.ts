// PostgreSQL plans every statement by its statistics of the tables, and a table that grows from
// empty has none until autovacuum's first ANALYZE of it, a minute or more later. Until then the
// planner takes the deliveries table for a few pages and plans lookups that read all of it: the
// order queues' promotion (a PL/pgSQL function, whose cached plans the renaming of
// lib/pg-statements.ts does not reach) joined every waiting row and every head of every queue
// for each call, 160-270 ms a call on 100,000 rows, and under a millisecond after one ANALYZE
// (docs/benchmarks.md, 2026-12-01 21:10). So the dispatcher analyzes its tables itself while they
// are young: each time the rows it has written pass a step, once. An ANALYZE also makes every
// connection plan its cached statements again.

/** The rows written after which the tables are analyzed, once each. */
export const ANALYZE_AFTER_ROWS = [1_000, 10_000, 100_000];

export class YoungTableStatistics {
	private written = 0;
	private step = 0;
	private running: Promise<void> | null = null;

	/**
	 * @param analyze analyzes the tables, and reports its own failures (it must not reject); told
	 * how many rows this instance has written, so that it can leave out a table whose statistics
	 * already describe more than that.
	 */
	constructor(private readonly analyze: (rowsWritten: number) => Promise<void>, private readonly steps: readonly number[] = ANALYZE_AFTER_ROWS) {}

	/** Counts rows written; past the next step, analyzes (in the background, one run at a time). */
	noteWritten(rows: number): void {
		this.written += rows;
		if (this.step >= this.steps.length || this.written < this.steps[this.step] || this.running) return;
		while (this.step < this.steps.length && this.written >= this.steps[this.step]) this.step += 1;
		this.running = this.analyze(this.written).finally(() => (this.running = null));
	}

	/** The analysis running now, if any (for a clean stop). */
	settled(): Promise<void> {
		return this.running ?? Promise.resolve();
	}
}
