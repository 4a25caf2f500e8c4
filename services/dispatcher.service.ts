// dispatcher: owns webhook delivery (tables `delivery_messages`, `deliveries`,
// `delivery_attempts`, `delivery_rejected_events`). It takes in `tasking.order_status` events,
// persists one message per event and one delivery per subscribed webhook before any request is
// made, sends them through lib/webhook-sender.ts, retries failures on the persisted schedule of
// lib/retry-schedule.ts, and serves the webhook test and the delivery log.
//
// How a delivery moves:
//   intake   events arriving together are written in one transaction; each new delivery is
//            leased to this instance in that same insert and handed straight to the worker.
//   worker   sends within the global and per-webhook concurrency limits; results are written
//            back in batches (deliveries updated and attempts inserted in one transaction).
//   claims   a poll loop leases due deliveries (retries, overflow, other instances' expired
//            leases). A lease is the row's next_attempt_at moved to the lease expiry plus a
//            lease_id: an abandoned lease simply makes the row due again, and a result write
//            must match the lease_id, so a stale worker cannot overwrite a newer attempt.
//            PostgreSQL claims with FOR UPDATE SKIP LOCKED; SQLite has a single writer.
import { type Context, type ServiceSchema, type ServiceSettingSchema } from "moleculer";
import type { Knex } from "knex";
import { DbMixin, nowIso } from "../mixins/db.mixin";
import { dispatcherMigrations } from "../migrations/dispatcher";
import { MicroBatcher } from "../lib/micro-batcher";
import { sqliteBoolean, sqliteConnectionOf } from "../lib/sqlite-statements";
import { chunks, rowsOf } from "../lib/sql-rows";
import { scheduleNextAttempt } from "../lib/retry-schedule";
import { counter, histogram } from "../lib/metrics";
import { WebhookSender, type DeliveryOutcome } from "../lib/webhook-sender";
import type { ResolvedWebhook } from "../lib/schemas/webhooks";
import {
	messageIdOf,
} from "../lib/schemas/deliveries";
import {
	DEPENDENCY_RETRY_MS,
	LEASE_BUFFER_FACTOR,
	LEASE_SAFETY_MS,
	MAX_INTAKE_BATCH,
	MAX_RESULT_BATCH,
	RESULT_LINGER_MS,
	ROWS_PER_STATEMENT,
	TARGET_CACHE_MS,
	type AttemptRow,
	type DeliveryUpdate,
	type DispatcherThis,
	type LeasedDelivery,
	type Target,
} from "../mixins/dispatcher/shared";
import { ClaimsMixin } from "../mixins/dispatcher/claims.mixin";
import { DeliveryLogMixin } from "../mixins/dispatcher/delivery-log.mixin";
import { IntakeMixin } from "../mixins/dispatcher/intake.mixin";

const sleep = (ms: number) => new Promise(resolve => setTimeout(resolve, ms));

const DispatcherService: ServiceSchema<ServiceSettingSchema, DispatcherThis> = {
	name: "dispatcher",
	mixins: [DbMixin("dispatcher", dispatcherMigrations) as Partial<ServiceSchema>, IntakeMixin as Partial<ServiceSchema>, DeliveryLogMixin as Partial<ServiceSchema>, ClaimsMixin as Partial<ServiceSchema>],

	events: {
		"webhooks.updated": {
			async handler(this: DispatcherThis, ctx: Context<{ id?: unknown; active?: unknown }>) {
				const { id, active } = ctx.params ?? {};
				if (typeof id !== "string") return;
				this.targets.delete(id);
				if (active === true) await this.resumeParked(id).catch(err => this.logger.error(`Could not resume deliveries of webhook ${id}`, err));
			},
		},

		"webhooks.removed": {
			async handler(this: DispatcherThis, ctx: Context<{ id?: unknown }>) {
				const id = ctx.params?.id;
				if (typeof id !== "string") return;
				this.cacheTarget(id, null);
				const cancelled = await this.cancelPending(id).catch(err => {
					this.logger.error(`Could not cancel deliveries of removed webhook ${id}`, err);
					return 0;
				});
				if (cancelled) this.logger.info(`Webhook ${id} removed: ${cancelled} pending deliveries cancelled`);
				this.pump();
			},
		},

		"webhooks.rotated": {
			handler(this: DispatcherThis, ctx: Context<{ id?: unknown }>) {
				const id = ctx.params?.id;
				if (typeof id === "string") this.targets.delete(id);
			},
		},
	},

	methods: {
		// ---- worker -------------------------------------------------------------------------

		/** Takes a local lease slot if this instance has room for one more delivery of the webhook. */
		takeLease(this: DispatcherThis, webhookId: string): boolean {
			const perWebhook = this.heldByWebhook.get(webhookId) ?? 0;
			if (this.held >= this.config.DELIVERY_CONCURRENCY * LEASE_BUFFER_FACTOR) return false;
			if (perWebhook >= this.config.DELIVERY_WEBHOOK_CONCURRENCY * LEASE_BUFFER_FACTOR) return false;
			this.held += 1;
			this.heldByWebhook.set(webhookId, perWebhook + 1);
			return true;
		},

		releaseHold(this: DispatcherThis, webhookId: string): void {
			this.held -= 1;
			const left = (this.heldByWebhook.get(webhookId) ?? 1) - 1;
			if (left > 0) this.heldByWebhook.set(webhookId, left);
			else this.heldByWebhook.delete(webhookId);
		},

		enqueue(this: DispatcherThis, delivery: LeasedDelivery): void {
			const queue = this.queues.get(delivery.webhookId);
			if (queue) queue.push(delivery);
			else this.queues.set(delivery.webhookId, [delivery]);
		},

		/** Starts as many queued attempts as the concurrency limits allow, webhooks taking turns. */
		pump(this: DispatcherThis): void {
			if (this.stopping) return;
			const globalLimit = this.config.DELIVERY_CONCURRENCY;
			const webhookLimit = this.config.DELIVERY_WEBHOOK_CONCURRENCY;
			const unresolved: string[] = [];
			let started = true;
			while (started && this.inFlight < globalLimit && this.queues.size > 0) {
				started = false;
				for (const webhookId of [...this.queues.keys()]) {
					if (this.inFlight >= globalLimit) break;
					const queue = this.queues.get(webhookId)!;
					if ((this.inFlightByWebhook.get(webhookId) ?? 0) >= webhookLimit) continue;
					const target = this.freshTarget(webhookId);
					if (target === undefined) {
						if (!this.resolving.has(webhookId) && !unresolved.includes(webhookId)) unresolved.push(webhookId);
						continue;
					}
					if (target === null || !target.active) {
						// Deleted: cancelled. Disabled: parked until it is enabled again (not an attempt).
						this.queues.delete(webhookId);
						for (const delivery of queue) {
							this.finish(delivery, target === null
								? { status: "cancelled", attemptCount: delivery.attemptCount, nextAttemptAt: null, parked: false, manualRetry: false }
								: { status: "pending", attemptCount: delivery.attemptCount, nextAttemptAt: null, parked: true, manualRetry: delivery.manualRetry });
						}
						continue;
					}
					const delivery = queue.shift()!;
					// Rotate this webhook to the back, so that a busy one cannot starve the others.
					this.queues.delete(webhookId);
					if (queue.length > 0) this.queues.set(webhookId, queue);
					if (Date.now() + this.config.DELIVERY_TIMEOUT + LEASE_SAFETY_MS > delivery.leaseExpiresAt) {
						// Waited too long: the attempt could outlive the lease. Give the row back.
						this.finish(delivery, { status: "pending", attemptCount: delivery.attemptCount, nextAttemptAt: nowIso(), parked: false, manualRetry: delivery.manualRetry });
					} else {
						this.startAttempt(delivery, target);
					}
					started = true;
				}
			}
			if (unresolved.length > 0) void this.resolveTargets(unresolved);
		},

		freshTarget(this: DispatcherThis, webhookId: string): Target | null | undefined {
			const cached = this.targets.get(webhookId);
			if (!cached) return undefined;
			if (cached.expiresAt < Date.now()) {
				this.targets.delete(webhookId);
				return undefined;
			}
			return cached.target;
		},

		cacheTarget(this: DispatcherThis, webhookId: string, target: Target | null): void {
			this.targets.set(webhookId, { target, expiresAt: Date.now() + TARGET_CACHE_MS });
		},

		/** One webhooks.resolve call for every webhook the worker needs and has not cached. */
		async resolveTargets(this: DispatcherThis, webhookIds: string[]): Promise<void> {
			for (const id of webhookIds) this.resolving.add(id);
			let retryLater = false;
			try {
				for (const ids of chunks(webhookIds, 1000)) {
					const found = await this.broker.call<ResolvedWebhook[], { ids: string[] }>("webhooks.resolve", { ids });
					const byId = new Map(found.map(webhook => [webhook.id, webhook]));
					for (const id of ids) {
						const webhook = byId.get(id);
						this.cacheTarget(id, webhook ? { id, url: webhook.url, active: webhook.active, secrets: webhook.secrets } : null);
					}
				}
			} catch (err) {
				this.logger.warn(`Could not look up webhooks for delivery, will try again: ${(err as Error).message}`);
				retryLater = true;
			} finally {
				for (const id of webhookIds) this.resolving.delete(id);
			}
			if (retryLater) setTimeout(() => this.pump(), DEPENDENCY_RETRY_MS).unref();
			else this.pump();
		},

		startAttempt(this: DispatcherThis, delivery: LeasedDelivery, target: Target): void {
			this.inFlight += 1;
			this.inFlightByWebhook.set(delivery.webhookId, (this.inFlightByWebhook.get(delivery.webhookId) ?? 0) + 1);
			const attempt = this.sender
				.send({ url: target.url, messageId: messageIdOf(delivery.id), body: delivery.body, secrets: target.secrets, timeoutMs: this.config.DELIVERY_TIMEOUT })
				.then(outcome => {
					const update = this.afterAttempt(delivery, outcome);
					this.finish(delivery, update);
				})
				.catch(err => {
					// The sender reports network trouble as outcomes; this is a bug. The lease will expire
					// and the delivery will be attempted again.
					this.logger.error(`Attempt of delivery ${delivery.id} failed unexpectedly`, err);
				})
				.finally(() => {
					this.inFlight -= 1;
					const left = (this.inFlightByWebhook.get(delivery.webhookId) ?? 1) - 1;
					if (left > 0) this.inFlightByWebhook.set(delivery.webhookId, left);
					else this.inFlightByWebhook.delete(delivery.webhookId);
					this.attemptsInFlight.delete(attempt);
					this.pump();
				});
			this.attemptsInFlight.add(attempt);
		},

		/** Decides what an attempt's outcome means for the delivery: done, retry at, or failed. */
		afterAttempt(this: DispatcherThis, delivery: LeasedDelivery, outcome: DeliveryOutcome): DeliveryUpdate {
			const attemptCount = delivery.attemptCount + 1;
			const result = outcome.success ? "succeeded" : "failed";
			this.metrics.attempts.inc({ result });
			this.metrics.duration.observe({ result }, outcome.durationMs / 1000);
			if (outcome.success) {
				this.metrics.deliveries.inc({ status: "succeeded" });
				return { delivery, status: "succeeded", attemptCount, nextAttemptAt: null, parked: false, manualRetry: false, outcome };
			}
			const next = delivery.manualRetry
				? null
				: scheduleNextAttempt({
						firstAttemptAt: new Date(delivery.firstAttemptAt ?? outcome.attemptedAt),
						attemptsMade: attemptCount,
						offsets: this.config.DELIVERY_RETRY_SCHEDULE,
						now: new Date(),
					});
			if (!next) {
				this.metrics.deliveries.inc({ status: "failed" });
				this.logger.info(`Delivery ${delivery.id} failed after ${attemptCount} attempt(s): ${outcome.detail}`);
				return { delivery, status: "failed", attemptCount, nextAttemptAt: null, parked: false, manualRetry: false, outcome };
			}
			return { delivery, status: "pending", attemptCount, nextAttemptAt: next.toISOString(), parked: false, manualRetry: false, outcome };
		},

		/**
		 * Frees the delivery's slot and queues the write-back of its result. The slot is free at
		 * once: the row stays leased in the database until the write lands, so nobody else claims it.
		 */
		finish(this: DispatcherThis, delivery: LeasedDelivery, change: Omit<DeliveryUpdate, "delivery">): void {
			const update: DeliveryUpdate = { ...change, delivery };
			this.releaseHold(delivery.webhookId);
			// Claim in batches (not one row per finished delivery), early enough to keep every slot busy.
			const room = this.config.DELIVERY_CONCURRENCY * LEASE_BUFFER_FACTOR - this.held;
			if (this.backlog && room >= this.config.DELIVERY_CONCURRENCY / 2) this.claimSoon();
			const write = async () => {
				for (let attempt = 1; ; attempt += 1) {
					try {
						const matched = await this.results.add(update);
						if (!matched) this.logger.debug(`Delivery ${delivery.id}: lease lost before the result was written (taken over, cancelled or retried by hand)`);
						return;
					} catch (err) {
						// Past the lease the write is pointless: the row is due again and someone retries it.
						if (this.stopping || Date.now() > delivery.leaseExpiresAt) {
							this.logger.error(`Delivery ${delivery.id}: result not written; it will be attempted again once its lease expires`, err);
							return;
						}
						await sleep(DEPENDENCY_RETRY_MS * attempt);
					}
				}
			};
			void write();
		},

		/**
		 * Writes a batch of results in one transaction: one UPDATE for all deliveries (each guarded
		 * by its lease) and one INSERT for the attempts of those whose lease still held.
		 */
		async writeUpdates(this: DispatcherThis, updates: DeliveryUpdate[]): Promise<boolean[]> {
			const now = nowIso();
			let matched = new Set<string>();
			await this.db.transaction(async trx => {
				matched = await this.updateLeased(trx, updates, now);
				const attempts: AttemptRow[] = updates
					.filter(update => update.outcome && matched.has(update.delivery.id))
					.map(({ delivery, attemptCount, outcome }) => ({
						delivery_id: delivery.id,
						attempt: attemptCount,
						attempted_at: outcome!.attemptedAt,
						success: outcome!.success,
						status_code: outcome!.statusCode,
						error_kind: outcome!.errorKind,
						title: outcome!.title,
						detail: outcome!.detail.slice(0, 500),
						duration_ms: outcome!.durationMs,
						response_excerpt: outcome!.responseExcerpt,
					}));
				await this.insertAttempts(trx, attempts);
			});
			return updates.map(update => matched.has(update.delivery.id));
		},

		/**
		 * Writes each update where the delivery's lease still matches, and returns the ids that
		 * matched. A delivery whose lease was lost (cancelled, taken over) is left alone.
		 */
		async updateLeased(this: DispatcherThis, trx: Knex.Transaction, updates: DeliveryUpdate[], now: string): Promise<Set<string>> {
			const matched = new Set<string>();
			const sqlite = await sqliteConnectionOf(trx);
			if (sqlite) {
				const update = sqlite.prepare(
					`UPDATE deliveries SET
						status = @status, attempt_count = @attempt_count, next_attempt_at = @next_attempt_at,
						parked = @parked, manual_retry = @manual_retry, lease_id = NULL,
						first_attempt_at = COALESCE(first_attempt_at, @attempted_at),
						last_attempt_at = CASE WHEN @attempted = 1 THEN @attempted_at ELSE last_attempt_at END,
						last_status_code = CASE WHEN @attempted = 1 THEN @status_code ELSE last_status_code END,
						last_error_kind = CASE WHEN @attempted = 1 THEN @error_kind ELSE last_error_kind END,
						updated_at = @updated_at
					WHERE id = @id AND lease_id = @lease_id`,
				);
				for (const change of updates) {
					const result = update.run({
						id: change.delivery.id,
						lease_id: change.delivery.leaseId,
						status: change.status,
						attempt_count: change.attemptCount,
						next_attempt_at: change.nextAttemptAt,
						parked: sqliteBoolean(change.parked),
						manual_retry: sqliteBoolean(change.manualRetry),
						attempted: change.outcome ? 1 : 0,
						attempted_at: change.outcome?.attemptedAt ?? null,
						status_code: change.outcome?.statusCode ?? null,
						error_kind: change.outcome?.errorKind ?? null,
						updated_at: now,
					});
					if (result.changes === 1) matched.add(change.delivery.id);
				}
				return matched;
			}
			// One statement for the whole batch: a VALUES list joined to the rows it updates.
			for (const batch of chunks(updates, ROWS_PER_STATEMENT)) {
				const values = batch.map(() => "(?, ?, ?, CAST(? AS integer), ?, CAST(? AS integer), CAST(? AS integer), CAST(? AS integer), ?, CAST(? AS integer), ?)").join(", ");
				const bindings = batch.flatMap(change => [
					change.delivery.id,
					change.delivery.leaseId,
					change.status,
					change.attemptCount,
					change.nextAttemptAt,
					change.parked ? 1 : 0,
					change.manualRetry ? 1 : 0,
					change.outcome ? 1 : 0,
					change.outcome?.attemptedAt ?? null,
					change.outcome?.statusCode ?? null,
					change.outcome?.errorKind ?? null,
				]);
				const result = await trx.raw(
					`WITH v(id, lease_id, status, attempt_count, next_attempt_at, parked, manual_retry, attempted, attempted_at, status_code, error_kind) AS (VALUES ${values})
					UPDATE deliveries SET
						status = v.status,
						attempt_count = v.attempt_count,
						next_attempt_at = v.next_attempt_at,
						parked = (v.parked = 1),
						manual_retry = (v.manual_retry = 1),
						lease_id = NULL,
						first_attempt_at = COALESCE(deliveries.first_attempt_at, v.attempted_at),
						last_attempt_at = CASE WHEN v.attempted = 1 THEN v.attempted_at ELSE deliveries.last_attempt_at END,
						last_status_code = CASE WHEN v.attempted = 1 THEN v.status_code ELSE deliveries.last_status_code END,
						last_error_kind = CASE WHEN v.attempted = 1 THEN v.error_kind ELSE deliveries.last_error_kind END,
						updated_at = ?
					FROM v
					WHERE deliveries.id = v.id AND deliveries.lease_id = v.lease_id
					RETURNING deliveries.id`,
					[...bindings, now],
				);
				for (const row of rowsOf<{ id: string }>(result)) matched.add(row.id);
			}
			return matched;
		},

		async insertAttempts(this: DispatcherThis, trx: Knex.Transaction, rows: AttemptRow[]): Promise<void> {
			const sqlite = await sqliteConnectionOf(trx);
			if (sqlite) {
				const insert = sqlite.prepare(
					`INSERT INTO delivery_attempts (delivery_id, attempt, attempted_at, success, status_code, error_kind, title, detail, duration_ms, response_excerpt)
					VALUES (@delivery_id, @attempt, @attempted_at, @success, @status_code, @error_kind, @title, @detail, @duration_ms, @response_excerpt)`,
				);
				for (const row of rows) insert.run({ ...row, success: sqliteBoolean(Boolean(row.success)) });
				return;
			}
			for (const batch of chunks(rows, ROWS_PER_STATEMENT)) await trx("delivery_attempts").insert(batch);
		},
	},

	created(this: DispatcherThis) {
		this.stopping = false;
		this.queues = new Map();
		this.inFlight = 0;
		this.inFlightByWebhook = new Map();
		this.held = 0;
		this.heldByWebhook = new Map();
		this.attemptsInFlight = new Set();
		this.targets = new Map();
		this.resolving = new Set();
		this.claimRun = null;
		this.backlog = true;
		this.pollTimer = null;
		this.polls = 0;
		this.intake = new MicroBatcher(items => this.persistEvents(items), MAX_INTAKE_BATCH);
		this.results = new MicroBatcher(updates => this.writeUpdates(updates), MAX_RESULT_BATCH, RESULT_LINGER_MS);
		this.metrics = {
			attempts: counter(this.broker, "webhook_delivery_attempts_total", "Webhook delivery attempts, by result", ["result"]),
			deliveries: counter(this.broker, "webhook_deliveries_finished_total", "Webhook deliveries that reached a final status", ["status"]),
			duration: histogram(this.broker, "webhook_delivery_attempt_seconds", "Duration of webhook delivery attempts", ["result"], [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15]),
		};
	},

	async started(this: DispatcherThis) {
		const { DELIVERY_LEASE, DELIVERY_TIMEOUT } = this.config;
		if (DELIVERY_LEASE < DELIVERY_TIMEOUT + 2 * LEASE_SAFETY_MS) {
			throw new Error(`Invalid configuration: DELIVERY_LEASE (${DELIVERY_LEASE} ms) must exceed DELIVERY_TIMEOUT (${DELIVERY_TIMEOUT} ms) by at least ${(2 * LEASE_SAFETY_MS) / 1000} s`);
		}
		this.sender = new WebhookSender({
			allowNets: this.config.WEBHOOK_ALLOW_NETS,
			caFile: this.config.WEBHOOK_CA_FILE,
			connectionsPerOrigin: this.config.DELIVERY_WEBHOOK_CONCURRENCY,
		});
		this.schedulePoll();
		this.claimSoon();
	},

	async stopped(this: DispatcherThis) {
		this.stopping = true;
		if (this.pollTimer) clearTimeout(this.pollTimer);
		// No new leases from here on. Deliveries still queued go back to the database as due now;
		// attempts in flight finish and are written; the writers drain before the database
		// connection is released (the DbMixin's stopped runs after this one).
		await this.claimRun;
		await this.intake.drain();
		for (const queue of this.queues.values()) {
			for (const delivery of queue) {
				this.finish(delivery, { status: "pending", attemptCount: delivery.attemptCount, nextAttemptAt: nowIso(), parked: false, manualRetry: delivery.manualRetry });
			}
		}
		this.queues.clear();
		await Promise.allSettled([...this.attemptsInFlight]);
		await this.results.drain();
		await this.sender?.close();
	},
};

export default DispatcherService;
