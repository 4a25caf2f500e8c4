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
import { DbMixin, nowIso } from "../mixins/db.mixin";
import { dispatcherMigrations } from "../migrations/dispatcher";
import { MicroBatcher } from "../lib/micro-batcher";
import { chunks } from "../lib/sql-rows";
import { counter, histogram } from "../lib/metrics";
import { WebhookSender } from "../lib/webhook-sender";
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
	TARGET_CACHE_MS,
	type DispatcherThis,
	type LeasedDelivery,
	type Target,
} from "../mixins/dispatcher/shared";
import { ResultsMixin } from "../mixins/dispatcher/results.mixin";
import { ClaimsMixin } from "../mixins/dispatcher/claims.mixin";
import { DeliveryLogMixin } from "../mixins/dispatcher/delivery-log.mixin";
import { IntakeMixin } from "../mixins/dispatcher/intake.mixin";

const DispatcherService: ServiceSchema<ServiceSettingSchema, DispatcherThis> = {
	name: "dispatcher",
	mixins: [DbMixin("dispatcher", dispatcherMigrations) as Partial<ServiceSchema>, IntakeMixin as Partial<ServiceSchema>, DeliveryLogMixin as Partial<ServiceSchema>, ClaimsMixin as Partial<ServiceSchema>, ResultsMixin as Partial<ServiceSchema>],

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
