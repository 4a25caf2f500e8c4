// Dispatcher worker, the send loop: leased deliveries wait in a queue per webhook and are sent
// through lib/webhook-sender.ts within the global and per-webhook concurrency limits, webhooks
// taking turns so that a busy one cannot starve the others. The lease budget (queued + in flight,
// per webhook and per instance) is shared by intake and claims, see shared.ts. Each webhook's URL and
// secrets come from a short-lived cache filled by webhooks.resolve and emptied by the webhooks.*
// events; a delivery of a removed webhook is cancelled, one of a disabled webhook parked. A
// webhook whose last attempt failed is sent one attempt at a time until one succeeds, and one that
// keeps failing only a probe a second (lib/endpoint-breaker.ts): its queued deliveries go back to
// the database, due, and intake and claims leave its rows there until a probe succeeds.
import type { Context } from "moleculer";
import { nowIso } from "../db.mixin";
import { chunks } from "../../lib/sql-rows";
import type { Subscriber } from "../../lib/schemas/webhooks";
import { messageIdOf } from "../../lib/schemas/deliveries";
import { traceAttempt } from "../../lib/tracing";
import {
	DEPENDENCY_RETRY_MS,
	MAX_WEBHOOK_LEASE_FACTOR,
	WEBHOOK_LEASE_FACTOR,
	LEASE_SAFETY_MS,
	leaseAheadMs,
	TARGET_CACHE_MS,
	BREAKER,
	keepSigningUntil,
	targetOf,
	type DispatcherMixin,
	type DispatcherThis,
	type LeasedDelivery,
	type Target,
	resolveWebhooks,
} from "./shared";

export const WorkerMixin: DispatcherMixin = {
	events: {
		"webhooks.updated": {
			async handler(this: DispatcherThis, ctx: Context<{ id?: unknown; active?: unknown }>) {
				const { id, active } = ctx.params ?? {};
				if (typeof id !== "string") return;
				this.targets.delete(id);
				// A new URL, or an endpoint enabled again: its failures and its speed here say nothing about it now.
				this.breakers.forget(id);
				this.drainRates.forget(id);
				if (active === true) await this.resumeParked(id).catch(err => this.logger.error(`Could not resume deliveries of webhook ${id}`, err));
			},
		},

		"webhooks.removed": {
			async handler(this: DispatcherThis, ctx: Context<{ id?: unknown }>) {
				const id = ctx.params?.id;
				if (typeof id !== "string") return;
				this.cacheTarget(id, null);
				this.breakers.forget(id);
				this.drainRates.forget(id);
				this.stopWaiting(id);
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
		/**
		 * Takes a lease at intake if this instance has room for one more delivery of the webhook
		 * and none of the webhook's rows wait in the database: a new row must not overtake them.
		 */
		takeLease(this: DispatcherThis, webhookId: string): boolean {
			const perWebhook = this.heldByWebhook.get(webhookId) ?? 0;
			if (this.breakers.isOpen(webhookId) || this.waitingWebhooks.has(webhookId)) return false;
			if (this.roomLeft() <= 0 || perWebhook >= this.webhookShare(webhookId)) return false;
			this.held += 1;
			this.heldByWebhook.set(webhookId, perWebhook + 1);
			return true;
		},

		/**
		 * The most leases one webhook may hold here, queued and in flight: the fixed share, or as
		 * many as its queue drains in leaseAheadMs when that is more (a fast receiver in a burst:
		 * each delivery intake leases is one lease write and one claim fewer). Without a webhook,
		 * the fixed share, which is every webhook's until its drain rate is measured.
		 */
		webhookShare(this: DispatcherThis, webhookId?: string): number {
			const fixed = this.config.DELIVERY_WEBHOOK_CONCURRENCY * WEBHOOK_LEASE_FACTOR;
			if (webhookId === undefined) return fixed;
			const ahead = Math.floor((this.drainRates.perSecond(webhookId) * leaseAheadMs(this.config)) / 1_000);
			return Math.max(fixed, Math.min(ahead, this.config.DELIVERY_WEBHOOK_CONCURRENCY * MAX_WEBHOOK_LEASE_FACTOR));
		},

		/** The leases this instance may still take, over all webhooks. */
		roomLeft(this: DispatcherThis): number {
			return this.config.DELIVERY_MAX_LEASES - this.held;
		},

		/**
		 * Whether rows the webhook left in the database are worth a refill now: it is down to half
		 * the fixed share. Half the fixed share, whatever its own: a level every release passes on
		 * the way down, where its own share may have grown past twice what it holds between two
		 * releases (and a refill would never be asked for). A refill then takes it up to its own share.
		 */
		wantsRefill(this: DispatcherThis, webhookId: string): boolean {
			return (this.heldByWebhook.get(webhookId) ?? 0) <= this.webhookShare() / 2;
		},

		releaseHold(this: DispatcherThis, webhookId: string): void {
			this.held -= 1;
			const left = (this.heldByWebhook.get(webhookId) ?? 1) - 1;
			if (left > 0) this.heldByWebhook.set(webhookId, left);
			else this.heldByWebhook.delete(webhookId);
			// Once, as the webhook crosses to half the fixed share (wantsRefill): one refill per crossing, not one per attempt.
			if (left === Math.floor(this.webhookShare() / 2) && this.waitingWebhooks.has(webhookId)) this.requestRefill(webhookId);
		},

		enqueue(this: DispatcherThis, delivery: LeasedDelivery): void {
			const queue = this.queues.get(delivery.webhookId);
			if (queue) queue.push(delivery);
			else this.queues.set(delivery.webhookId, [delivery]);
		},

		/** Gives a leased delivery that was not attempted back to the database, due now. */
		giveBack(this: DispatcherThis, delivery: LeasedDelivery): void {
			this.finish(delivery, { status: "pending", attemptCount: delivery.attemptCount, nextAttemptAt: nowIso(), parked: false, manualRetry: delivery.manualRetry });
		},

		/**
		 * Puts a delivery that was not attempted back at the head of its webhook's queue, its lease
		 * still held; while stopping, back in the database, due now, as the rest of the queue goes.
		 */
		requeueFirst(this: DispatcherThis, delivery: LeasedDelivery): void {
			if (this.stopping) {
				this.giveBack(delivery);
				return;
			}
			const queue = this.queues.get(delivery.webhookId);
			if (queue) queue.unshift(delivery);
			else this.queues.set(delivery.webhookId, [delivery]);
		},

		/** Starts as many queued attempts as the concurrency limits allow, webhooks taking turns. */
		pump(this: DispatcherThis): void {
			if (this.stopping) return;
			const globalLimit = this.config.DELIVERY_CONCURRENCY;
			const webhookLimit = this.config.DELIVERY_WEBHOOK_CONCURRENCY;
			const unresolved: string[] = [];
			const now = Date.now();
			let started = true;
			while (started && this.inFlight < globalLimit && this.queues.size > 0) {
				started = false;
				for (const webhookId of [...this.queues.keys()]) {
					if (this.inFlight >= globalLimit) break;
					const queue = this.queues.get(webhookId)!;
					// A failing webhook's retries, due all the time, must not take the capacity healthy
					// webhooks need: one attempt at a time, or only a probe while its breaker is open.
					const limit = this.breakers.attemptLimit(webhookId, webhookLimit, now);
					if (limit === 0) {
						// Open, its probe not due: these would only wait with their leases running out.
						this.returnQueued(webhookId);
						continue;
					}
					if ((this.inFlightByWebhook.get(webhookId) ?? 0) >= limit) continue;
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
					// Over its rate limit: it waits for its next send time, the others go on.
					let startBy: number | null = null;
					if (target.rateLimit !== null) {
						startBy = this.takeSendTime(webhookId, target.rateLimit, now);
						if (startBy === null) continue;
					}
					const delivery = queue.shift()!;
					// Rotate this webhook to the back, so that a busy one cannot starve the others.
					this.queues.delete(webhookId);
					if (queue.length > 0) this.queues.set(webhookId, queue);
					if (Date.now() + this.config.DELIVERY_TIMEOUT + LEASE_SAFETY_MS > delivery.leaseExpiresAt) {
						// Waited too long: the attempt could outlive the lease. Give the row back.
						this.giveBack(delivery);
					} else {
						this.startAttempt(delivery, target, startBy);
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
			this.targets.set(webhookId, { target, expiresAt: keepSigningUntil(target ? [target] : [], TARGET_CACHE_MS) });
		},

		/** A customer's subscribed webhooks, just loaded by intake (all active), as the worker's targets. */
		cacheSubscriberTargets(this: DispatcherThis, subscribers: Subscriber[]): void {
			for (const subscriber of subscribers) this.cacheTarget(subscriber.id, targetOf(subscriber, true));
		},

		/** One webhooks.resolve call for every webhook the worker needs and has not cached. */
		async resolveTargets(this: DispatcherThis, webhookIds: string[]): Promise<void> {
			for (const id of webhookIds) this.resolving.add(id);
			let retryLater = false;
			try {
				for (const ids of chunks(webhookIds, 1000)) {
					const found = await resolveWebhooks(this.broker, ids);
					const byId = new Map(found.map(webhook => [webhook.id, webhook]));
					for (const id of ids) {
						const webhook = byId.get(id);
						this.cacheTarget(id, webhook ? targetOf(webhook, webhook.active) : null);
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

		/** `startBy`: a rate-limited attempt's latest start (its send time's deadline), else null. */
		startAttempt(this: DispatcherThis, delivery: LeasedDelivery, target: Target, startBy: number | null): void {
			this.inFlight += 1;
			this.inFlightByWebhook.set(delivery.webhookId, (this.inFlightByWebhook.get(delivery.webhookId) ?? 0) + 1);
			const request = { url: target.url, messageId: messageIdOf(delivery.id), body: delivery.body, secrets: target.secrets, headers: target.headers, timeoutMs: this.config.DELIVERY_TIMEOUT };
			const attempt = (startBy === null ? this.sender.send(request) : this.sender.sendBy(request, startBy))
				.then(outcome => {
					if (outcome === null) {
						// Its send time passed before it could start: not an attempt. First in line for the next one.
						this.metrics.missedStarts.inc();
						this.requeueFirst(delivery);
						return;
					}
					traceAttempt({ deliveryId: delivery.id, webhookId: delivery.webhookId, url: target.url, attempt: delivery.attemptCount + 1, traceContext: delivery.traceContext ?? null }, outcome);
					this.noteEndpointOutcome(delivery.webhookId, outcome.success);
					const update = this.afterAttempt(delivery, outcome);
					this.finish(delivery, update);
				})
				.catch(err => {
					// The sender reports network trouble as outcomes; this is a bug. The lease will expire
					// and the delivery will be attempted again.
					this.logger.error(`Attempt of delivery ${delivery.id} of webhook ${delivery.webhookId} failed unexpectedly`, err);
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

		/**
		 * Feeds the breaker. One that opens gives its queued deliveries back to the database, due
		 * now and unattempted, instead of holding their leases while they wait for probes; one
		 * that closes lets claims take the webhook's pile again at once.
		 */
		noteEndpointOutcome(this: DispatcherThis, webhookId: string, success: boolean): void {
			const change = this.breakers.record(webhookId, success, Date.now());
			if (change === "opened") {
				const returned = this.returnQueued(webhookId);
				this.stopWaiting(webhookId);
				// Once it answers again, its share starts from the fixed one until its speed is measured.
				this.drainRates.forget(webhookId);
				this.logger.warn(`Webhook ${webhookId}: ${BREAKER.openAfter} attempts in a row failed; one probe attempt a second until one succeeds (${returned} queued deliveries wait in the database meanwhile)`);
			} else if (change === "closed") {
				this.logger.info(`Webhook ${webhookId} answers again: its waiting deliveries resume`);
				// Its pile goes first: intake leases none of its new rows until a claim has taken it.
				this.waitingWebhooks.add(webhookId);
				this.requestRefill(webhookId);
			}
		},

		/** Gives the webhook's queued (leased, not started) deliveries back to the database, due now. */
		returnQueued(this: DispatcherThis, webhookId: string): number {
			const queued = this.queues.get(webhookId) ?? [];
			this.queues.delete(webhookId);
			for (const delivery of queued) {
				this.giveBack(delivery);
			}
			return queued.length;
		},
	},
};
