// Retention for a service that owns tables: runs its prune jobs (lib/retention.ts) on a
// schedule, one run at a time, and exposes them as the action `<service>.prune` for operators
// (`call dispatcher.prune` in the REPL) and tests. A run stops between batches when the service
// stops. Deletions are counted in `retention_pruned_rows_total{table}`.
import type { ServiceSchema, ServiceSettingSchema } from "moleculer";
import { z } from "zod";
import { zodParams } from "./validation";
import type { DbServiceThis } from "./db.mixin";
import { counter } from "../lib/metrics";
import { runPruneJobs, type PruneJob } from "../lib/retention";

/** How often each instance prunes; the first run comes a little after start-up, at a random moment. */
export const PRUNE_INTERVAL_MS = 10 * 60_000;
const FIRST_PRUNE_MAX_DELAY_MS = 60_000;

type RetentionThis = DbServiceThis & {
	pruneTimer: NodeJS.Timeout | null;
	pruneRun: Promise<Record<string, number>> | null;
	pruneStopping: boolean;
	pruneNow(): Promise<Record<string, number>>;
	schedulePrune(delayMs: number): void;
};

export function RetentionMixin(jobs: PruneJob[]): Partial<ServiceSchema<ServiceSettingSchema, RetentionThis>> {
	return {
		actions: {
			/** Prunes now (waiting for a run already under way); answers the rows deleted per table. */
			prune: {
				visibility: "public",
				params: zodParams(z.object({}).strict()),
				async handler(this: RetentionThis): Promise<Record<string, number>> {
					if (this.pruneRun) await this.pruneRun.catch(() => undefined);
					return this.pruneNow();
				},
			},
		},

		methods: {
			async pruneNow(this: RetentionThis): Promise<Record<string, number>> {
				if (this.pruneRun) return this.pruneRun;
				const pruned = counter(this.broker, "retention_pruned_rows_total", "Rows deleted by retention (RETENTION_PERIOD), by table", ["table"]);
				this.pruneRun = runPruneJobs(this.db, jobs, { retentionMs: this.config.RETENTION_PERIOD, stopping: () => this.pruneStopping })
					.then(deleted => {
						for (const [table, count] of Object.entries(deleted)) if (count > 0) pruned.inc({ table }, count);
						const total = Object.values(deleted).reduce((sum, count) => sum + count, 0);
						if (total > 0) this.logger.info(`Retention: pruned ${Object.entries(deleted).filter(([, count]) => count > 0).map(([table, count]) => `${count} ${table}`).join(", ")}`);
						return deleted;
					})
					.finally(() => {
						this.pruneRun = null;
					});
				return this.pruneRun;
			},

			schedulePrune(this: RetentionThis, delayMs: number): void {
				if (this.pruneStopping) return;
				this.pruneTimer = setTimeout(() => {
					this.pruneNow()
						.catch(err => this.logger.warn(`Retention run failed, will try again: ${(err as Error).message}`))
						.finally(() => this.schedulePrune(PRUNE_INTERVAL_MS));
				}, delayMs);
				this.pruneTimer.unref();
			},
		},

		created(this: RetentionThis) {
			this.pruneTimer = null;
			this.pruneRun = null;
			this.pruneStopping = false;
		},

		started(this: RetentionThis) {
			this.schedulePrune(Math.round(Math.random() * FIRST_PRUNE_MAX_DELAY_MS));
		},

		async stopped(this: RetentionThis) {
			this.pruneStopping = true;
			if (this.pruneTimer) clearTimeout(this.pruneTimer);
			await this.pruneRun?.catch(() => undefined);
		},
	};
}
