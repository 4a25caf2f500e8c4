// Retention (RETENTION_PERIOD): finished work older than the period is deleted in small batches,
// each its own short statement or transaction, with a pause after each batch proportional to
// how long it took, so pruning a backlog of millions never holds the database (on SQLite, the
// single writer) away from deliveries for long. Pending work is never selected. Pure helpers on
// a knex handle; mixins/retention.mixin.ts schedules them in each service that owns tables.
import type { Knex } from "knex";

/** Rows (or messages) per batch: a few milliseconds of work on either engine. */
export const PRUNE_BATCH = 500;
/**
 * After a batch that took t ms, pause PRUNE_PAUSE_FACTOR × t (at least 5 ms): pruning takes at
 * most a tenth of the time. On SQLite a batch also blocks the process's event loop while it runs
 * (better-sqlite3 is synchronous), so this share is what deliveries lose while a backlog drains.
 */
export const PRUNE_PAUSE_FACTOR = 9;

export interface PruneContext {
	db: Knex;
	/** ISO time: finished rows older than this go. */
	cutoff: string;
	/** ISO time of this run, for things that expire at their own moment (rotation grace). */
	now: string;
	batchSize: number;
}

export interface PruneJob {
	/** What it prunes, e.g. the table name (a metric label). */
	name: string;
	/**
	 * Deletes one batch and says how many rows went. `done` is true when nothing is left to do
	 * in this run. The state object lives for one run (a keyset cursor, for instance).
	 */
	batch(context: PruneContext, state: Record<string, unknown>): Promise<{ deleted: number; done: boolean }>;
}

/**
 * One batch of `DELETE … WHERE key IN (SELECT key … WHERE time < cutoff [AND finished] ORDER BY
 * time LIMIT n)`, using the table's index on the time column.
 */
export function oldestRowsJob(name: string, table: string, key: string, timeColumn: string, finished?: (query: Knex.QueryBuilder) => void): PruneJob {
	return {
		name,
		async batch({ db, cutoff, batchSize }) {
			const oldest = db(table).select(key).where(timeColumn, "<", cutoff).orderBy(timeColumn).limit(batchSize);
			if (finished) finished(oldest);
			const deleted = await db(table).whereIn(key, oldest).delete();
			return { deleted, done: deleted < batchSize };
		},
	};
}

const sleep = (ms: number) => new Promise(resolve => setTimeout(resolve, ms).unref());

/** Runs every job to the end of its backlog (or until `stopping()`); returns rows deleted per job. */
export async function runPruneJobs(
	db: Knex,
	jobs: PruneJob[],
	options: { retentionMs: number; batchSize?: number; pauseFactor?: number; stopping?: () => boolean; now?: Date },
): Promise<Record<string, number>> {
	const now = options.now ?? new Date();
	const context: PruneContext = {
		db,
		cutoff: new Date(now.getTime() - options.retentionMs).toISOString(),
		now: now.toISOString(),
		batchSize: options.batchSize ?? PRUNE_BATCH,
	};
	const pauseFactor = options.pauseFactor ?? PRUNE_PAUSE_FACTOR;
	const deleted: Record<string, number> = {};
	for (const job of jobs) {
		deleted[job.name] = 0;
		const state: Record<string, unknown> = {};
		for (;;) {
			if (options.stopping?.()) return deleted;
			const started = performance.now();
			const result = await job.batch(context, state);
			deleted[job.name] += result.deleted;
			if (result.done) break;
			if (pauseFactor > 0) await sleep(Math.max(5, (performance.now() - started) * pauseFactor));
		}
	}
	return deleted;
}
