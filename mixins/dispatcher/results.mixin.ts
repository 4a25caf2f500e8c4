// Dispatcher results: what an attempt's outcome means for its delivery (succeeded, retry at the
// next time of the persisted schedule, or failed) and how it is written back. The worker's slot
// is freed at once; the write joins a micro-batch (`this.results`) that updates the deliveries
// and records their attempts in one transaction (SQLite) or one statement (PostgreSQL): a first
// attempt in the delivery's own row, a later one as a row of delivery_attempts; on SQLite
// an intake batch that commits first takes the waiting results into its own transaction
// (takeWaitingResults). Each update is guarded by the delivery's
// lease_id, so a worker whose lease was lost (taken over, cancelled, retried by hand) writes
// nothing. A row parked while its attempt was in flight (the webhook was disabled meanwhile)
// stays parked unless the attempt finished it: its retry waits for the webhook to be enabled.
import { setTimeout as sleep } from "node:timers/promises";
import type { Knex } from "knex";
import { isPostgres, nowIso } from "../db.mixin";
import { endedQueues, mayEndHeads, promoteNextSqlite } from "./order-queues.mixin";
import { inSqliteTransaction, sqliteBoolean, type SqliteConnection } from "../../lib/sqlite-statements";
import { columnArrays, runPrepared, unnestColumns, type ArrayElement, type PreparedStatement } from "../../lib/pg-statements";
import { scheduleNextAttempt } from "../../lib/retry-schedule";
import { honourRetryAfter } from "../../lib/retry-after";
import { timeOfOrderedUuid } from "../../lib/ids";
import type { DeliveryOutcome } from "../../lib/webhook-sender";
import {
	DEPENDENCY_RETRY_MS,
	type RidingResults,
	type DeliveryUpdate,
	type DispatcherMixin,
	type DispatcherThis,
	type LeasedDelivery,
} from "./shared";

// What a result write carries per delivery, as PostgreSQL columns: name, type, value.
const RESULT_COLUMNS: ReadonlyArray<readonly [string, string, (update: DeliveryUpdate) => ArrayElement]> = [
	["id", "uuid", update => update.delivery.id],
	["lease_id", "uuid", update => update.delivery.leaseId],
	["status", "text", update => update.status],
	["attempt_count", "integer", update => update.attemptCount],
	["next_attempt_at", "text", update => update.nextAttemptAt],
	["parked", "boolean", update => update.parked],
	["manual_retry", "boolean", update => update.manualRetry],
	["attempted", "boolean", update => update.outcome !== undefined],
	["attempted_at", "text", update => update.outcome?.attemptedAt ?? null],
	["status_code", "integer", update => update.outcome?.statusCode ?? null],
	["error_kind", "text", update => update.outcome?.errorKind ?? null],
	["success", "boolean", update => update.outcome?.success ?? false],
	["title", "text", update => update.outcome?.title ?? null],
	["detail", "text", update => (update.outcome ? update.outcome.detail.slice(0, 500) : null)],
	["duration_ms", "integer", update => update.outcome?.durationMs ?? null],
	["response_excerpt", "text", update => update.outcome?.responseExcerpt ?? null],
];
const RESULT_VALUES = RESULT_COLUMNS.map(([, , valueOf]) => valueOf);

/** What an attempt's row holds besides its delivery and number, as named in RESULT_COLUMNS. */
const ATTEMPT_COLUMNS = ["attempted_at", "success", "status_code", "error_kind", "title", "detail", "duration_ms", "response_excerpt"];

/**
 * A delivery's first attempt is kept in its own row (migration 014); later ones get rows of
 * delivery_attempts. An update that records no first attempt keeps the row's columns as they are.
 */
const FIRST_ATTEMPT_FIELDS = ATTEMPT_COLUMNS.filter(column => column !== "attempted_at"); // its time is first_attempt_at
const keepFirstAttempt = (isFirst: string, valueOf: (field: string) => string, current: (column: string) => string) =>
	FIRST_ATTEMPT_FIELDS.map(field => `first_attempt_${field} = CASE WHEN ${isFirst} THEN ${valueOf(field)} ELSE ${current(`first_attempt_${field}`)} END`).join(",\n\t\t\t");

/**
 * PostgreSQL: a batch of results in one prepared statement (one round trip): the lease-guarded
 * UPDATE, and the later attempts of the rows it matched. The update returns what the attempts need:
 * a join of its rows back to the batch was planned for the generic plan's guess of a few rows, a
 * nested loop that compared every row with every other (200 × 200 for a batch of 200).
 * The last parameter is the time of the write.
 */
const WRITE_RESULTS_POSTGRES: PreparedStatement = {
	name: "dispatcher_write_results",
	text: `WITH v AS (
		SELECT *, attempted AND attempt_count = 1 AS first_attempt FROM ${unnestColumns(RESULT_COLUMNS, 1, "r")}
	),
	u AS (
		UPDATE deliveries SET
			status = v.status,
			attempt_count = v.attempt_count,
			next_attempt_at = CASE WHEN v.status = 'pending' AND deliveries.parked THEN NULL ELSE v.next_attempt_at END,
			parked = CASE WHEN v.status = 'pending' AND deliveries.parked THEN true ELSE v.parked END,
			manual_retry = v.manual_retry,
			lease_id = NULL,
			first_attempt_at = COALESCE(deliveries.first_attempt_at, v.attempted_at),
			last_attempt_at = CASE WHEN v.attempted THEN v.attempted_at ELSE deliveries.last_attempt_at END,
			last_status_code = CASE WHEN v.attempted THEN v.status_code ELSE deliveries.last_status_code END,
			last_error_kind = CASE WHEN v.attempted THEN v.error_kind ELSE deliveries.last_error_kind END,
			${keepFirstAttempt("v.first_attempt", field => `v.${field}`, column => `deliveries.${column}`)},
			updated_at = $${RESULT_COLUMNS.length + 1}::text
		FROM v
		WHERE deliveries.id = v.id AND deliveries.lease_id = v.lease_id
		RETURNING deliveries.id, v.attempted, v.first_attempt, v.attempt_count, ${ATTEMPT_COLUMNS.map(column => `v.${column}`).join(", ")}
	),
	a AS (
		INSERT INTO delivery_attempts (delivery_id, attempt, ${ATTEMPT_COLUMNS.join(", ")})
		SELECT id, attempt_count, ${ATTEMPT_COLUMNS.join(", ")} FROM u WHERE attempted AND NOT first_attempt
	)
	SELECT id FROM u`,
};

/** PostgreSQL: the lease-guarded write of a batch (one prepared statement); returns the ids whose lease held. */
async function writeResultsPostgres(db: Knex, updates: DeliveryUpdate[], now: string): Promise<Set<string>> {
	const rows = await runPrepared<{ id: string }>(db, WRITE_RESULTS_POSTGRES, [...columnArrays(updates, RESULT_VALUES), now]);
	return new Set(rows.map(row => row.id));
}

/** What a result write did: the deliveries whose lease still held, and how many queued ones it set going. */
interface WrittenResults {
	matched: Set<string>;
	promoted: number;
}

/**
 * SQLite, inside one transaction: writes each update where the delivery's lease still matches
 * (a delivery whose lease was lost, cancelled or taken over, is left alone), then the later
 * attempts of the matched ones, then promotes the next delivery of each order queue whose head ended.
 */
function writeResultsSqlite(connection: SqliteConnection, updates: DeliveryUpdate[], now: string): WrittenResults {
	const update = connection.prepare(
		`UPDATE deliveries SET
			status = @status, attempt_count = @attempt_count,
			next_attempt_at = CASE WHEN @status = 'pending' AND parked THEN NULL ELSE @next_attempt_at END,
			parked = CASE WHEN @status = 'pending' AND parked THEN 1 ELSE @parked END,
			manual_retry = @manual_retry, lease_id = NULL,
			first_attempt_at = COALESCE(first_attempt_at, @attempted_at),
			last_attempt_at = CASE WHEN @attempted = 1 THEN @attempted_at ELSE last_attempt_at END,
			last_status_code = CASE WHEN @attempted = 1 THEN @status_code ELSE last_status_code END,
			last_error_kind = CASE WHEN @attempted = 1 THEN @error_kind ELSE last_error_kind END,
			${keepFirstAttempt("@first_attempt = 1", field => `@${field}`, column => column)},
			updated_at = @updated_at
		WHERE id = @id AND lease_id = @lease_id`,
	);
	const insertAttempt = connection.prepare(
		`INSERT INTO delivery_attempts (delivery_id, attempt, ${ATTEMPT_COLUMNS.join(", ")})
		VALUES (@delivery_id, @attempt, ${ATTEMPT_COLUMNS.map(column => `@${column}`).join(", ")})`,
	);
	const matched = new Set<string>();
	for (const { delivery, status, attemptCount, nextAttemptAt, parked, manualRetry, outcome } of updates) {
		const firstAttempt = outcome !== undefined && attemptCount === 1;
		const attemptFields = {
			success: sqliteBoolean(outcome?.success ?? false),
			status_code: outcome?.statusCode ?? null,
			error_kind: outcome?.errorKind ?? null,
			title: outcome?.title ?? null,
			detail: outcome ? outcome.detail.slice(0, 500) : null,
			duration_ms: outcome?.durationMs ?? null,
			response_excerpt: outcome?.responseExcerpt ?? null,
		};
		const result = update.run({
			id: delivery.id,
			lease_id: delivery.leaseId,
			status,
			attempt_count: attemptCount,
			next_attempt_at: nextAttemptAt,
			parked: sqliteBoolean(parked),
			manual_retry: sqliteBoolean(manualRetry),
			attempted: outcome ? 1 : 0,
			attempted_at: outcome?.attemptedAt ?? null,
			first_attempt: sqliteBoolean(firstAttempt),
			...attemptFields,
			updated_at: now,
		});
		if (result.changes !== 1) continue;
		matched.add(delivery.id);
		if (!outcome || firstAttempt) continue;
		insertAttempt.run({ delivery_id: delivery.id, attempt: attemptCount, attempted_at: outcome.attemptedAt, ...attemptFields });
	}
	return { matched, promoted: promoteNextSqlite(connection, endedQueues(updates, matched), now) };
}

export const ResultsMixin: DispatcherMixin = {
	methods: {
		/** Decides what an attempt's outcome means for the delivery: done, retry at, or failed. */
		afterAttempt(this: DispatcherThis, delivery: LeasedDelivery, outcome: DeliveryOutcome): DeliveryUpdate {
			const attemptCount = delivery.attemptCount + 1;
			const result = outcome.success ? "succeeded" : "failed";
			this.metrics.attempts.inc({ result });
			this.metrics.duration.observe({ result }, outcome.durationMs / 1000);
			this.observeFirstAttemptLag(delivery, outcome);
			this.noteOutcome(delivery.webhookId, outcome, attemptCount);
			this.drainRates.noteAttempt(delivery.webhookId, outcome.success, (this.queues.get(delivery.webhookId)?.length ?? 0) > 0, Date.now());
			if (outcome.success) {
				this.metrics.deliveries.inc({ status: "succeeded" });
				return { delivery, status: "succeeded", attemptCount, nextAttemptAt: null, parked: false, manualRetry: false, outcome };
			}
			if (outcome.statusCode === 410) {
				// The receiver says the endpoint is gone for good: disable the webhook, park this delivery.
				void this.disableWebhook(delivery.webhookId, "gone");
				return { delivery, status: "pending", attemptCount, nextAttemptAt: null, parked: true, manualRetry: delivery.manualRetry, outcome };
			}
			const firstAttemptAt = new Date(delivery.firstAttemptAt ?? outcome.attemptedAt);
			const scheduled = delivery.manualRetry
				? null
				: scheduleNextAttempt({
						firstAttemptAt,
						attemptsMade: attemptCount,
						offsets: this.config.DELIVERY_RETRY_SCHEDULE,
						now: new Date(),
					});
			// A Retry-After (429/502/503/504) delays the retry, within the schedule's window.
			const next = scheduled && honourRetryAfter(scheduled, outcome.retryAfter ? new Date(outcome.retryAfter) : null, firstAttemptAt, this.config.DELIVERY_RETRY_SCHEDULE);
			if (!next) {
				this.metrics.deliveries.inc({ status: "failed" });
				this.logger.info(`Delivery ${delivery.id} of webhook ${delivery.webhookId} failed after ${attemptCount} attempt(s): ${outcome.detail}`);
				return { delivery, status: "failed", attemptCount, nextAttemptAt: null, parked: false, manualRetry: false, outcome };
			}
			return { delivery, status: "pending", attemptCount, nextAttemptAt: next.toISOString(), parked: false, manualRetry: false, outcome };
		},

		/**
		 * How long a delivery waited for its first attempt: the intake's write, the send queue, the
		 * hand-off to a sender thread, or a claim after a backlog. A standing queue shows here first
		 * (a cluster short of CPU held deliveries 1.2 s past their commit while each attempt took
		 * milliseconds). The creation time is in the time-ordered id; older ids have none.
		 */
		observeFirstAttemptLag(this: DispatcherThis, delivery: LeasedDelivery, outcome: DeliveryOutcome): void {
			if (delivery.attemptCount !== 0) return;
			const createdAt = timeOfOrderedUuid(delivery.id);
			if (createdAt !== null) this.metrics.firstAttemptLag.observe(Math.max(0, Date.parse(outcome.attemptedAt) - createdAt) / 1000);
		},

		/**
		 * Frees the delivery's slot and queues the write-back of its result. The slot is free at
		 * once: the row stays leased in the database until the write lands, so nobody else claims it.
		 */
		finish(this: DispatcherThis, delivery: LeasedDelivery, change: Omit<DeliveryUpdate, "delivery">): void {
			const update: DeliveryUpdate = { ...change, delivery };
			this.releaseHold(delivery.webhookId);
			this.roomFreed();
			const write = async () => {
				for (let attempt = 1; ; attempt += 1) {
					try {
						const matched = await this.results.add(update);
						if (!matched) this.logger.debug(`Delivery ${delivery.id} of webhook ${delivery.webhookId}: lease lost before the result was written (taken over, cancelled or retried by hand)`);
						return;
					} catch (err) {
						// Past the lease the write is pointless: the row is due again and someone retries it.
						if (this.stopping || Date.now() > delivery.leaseExpiresAt) {
							this.logger.error(`Delivery ${delivery.id} of webhook ${delivery.webhookId}: result not written; it will be attempted again once its lease expires`, err);
							return;
						}
						await sleep(DEPENDENCY_RETRY_MS * attempt);
					}
				}
			};
			void write();
		},

		/**
		 * Writes a batch of results at once: per delivery a lease-guarded UPDATE, and the later
		 * attempts of those whose lease still held, and the promotion of the next deliveries of the
		 * order queues whose heads they ended. SQLite: one synchronous transaction; PostgreSQL: one
		 * prepared statement, then the promotion's.
		 */
		async writeUpdates(this: DispatcherThis, updates: DeliveryUpdate[]): Promise<boolean[]> {
			const now = nowIso();
			let matched: Set<string>;
			if (!isPostgres(this.db)) {
				const written = await inSqliteTransaction(this.db, connection => writeResultsSqlite(connection, updates, now));
				if (written.promoted > 0) this.requestClaim();
				matched = written.matched;
			} else {
				// The promotion the results imply follows their commit as a statement of its own: two
				// round trips where a transaction around both took five. A queue left without a head
				// by a crash in between is the sweep's (sweepHeadlessQueues).
				matched = await writeResultsPostgres(this.db, updates, now);
				if (mayEndHeads(updates)) await this.promoteHeadless(endedQueues(updates, matched));
			}
			return updates.map(update => matched.has(update.delivery.id));
		},

		/**
		 * SQLite: the results waiting for their batch, for intake to write in its own transaction.
		 * Each commit writes every page it changed, and a result changes the same pages as the
		 * intake of its webhook's next delivery (the indexes that start with webhook_id); in a
		 * profile COMMIT alone was 20-23 % of the main thread, more than all statements together.
		 */
		takeWaitingResults(this: DispatcherThis): RidingResults | null {
			const waiting = this.results.takeWaiting();
			if (!waiting) return null;
			let written: WrittenResults = { matched: new Set(), promoted: 0 };
			return {
				write: connection => {
					written = writeResultsSqlite(connection, waiting.items, nowIso());
				},
				committed: () => {
					if (written.promoted > 0) this.requestClaim();
					waiting.settle(waiting.items.map(update => written.matched.has(update.delivery.id)));
				},
				failed: error => waiting.fail(error),
			};
		},

	},
};
