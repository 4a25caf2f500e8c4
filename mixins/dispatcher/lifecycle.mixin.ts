// Dispatcher lifecycle: how a webhook's receiver and its history steer it, beyond one delivery.
//   gone      a 410 Gone answer disables the webhook at once (webhooks.disable, reason `gone`).
//   failing   every attempt of a webhook failed for WEBHOOK_DISABLE_AFTER, over at least
//             MIN_FAILED_MESSAGES messages: disabled with reason `failing`. Outcomes are folded
//             in memory and written to `webhook_failures` about once a second, so the send loop
//             never waits on this bookkeeping; a success on any instance deletes the webhook's row.
//   parking   a disabled webhook's pending deliveries are parked at once (next_attempt_at null),
//             whoever disabled it; re-enabling resumes them (parking.mixin.ts).
//   notice    a disable is told to the customer's webhooks subscribed to `webhook:disabled`,
//             persisted as a message with deliveries like any other, so it is signed and retried.
//   recover   action `recover`: a fresh attempt now for every failed delivery in a time window.
import crypto from "node:crypto";
import type { Context } from "moleculer";
import { nowIso } from "../db.mixin";
import { zodParams } from "../validation";
import { chunks } from "../../lib/sql-rows";
import { timeOrderedUuid } from "../../lib/ids";
import { WEBHOOK_DISABLED } from "../../lib/schemas/topics";
import type { DeliveryOutcome } from "../../lib/webhook-sender";
import { WebhookDisabledEvent, type DisableResult, type WebhookDisabledMessage } from "../../lib/schemas/webhooks";
import { MAX_RECOVER_BATCH, RecoverParams, type RecoverResult } from "../../lib/schemas/deliveries";
import { OUT_OF_ORDER_QUEUE, ROWS_PER_STATEMENT, lookUpSubscribers, type DispatcherMixin, type DispatcherThis, type NewDeliveryRow, type TenantMeta } from "./shared";

/** "At least a few messages": one failed request is no evidence that an endpoint is dead. */
export const MIN_FAILED_MESSAGES = 3;
/** How often folded outcomes are written to `webhook_failures`. */
export const HEALTH_FLUSH_MS = 1_000;
const SYSTEM_USER = "system:webhooks";

/** What one instance saw of a webhook since its last flush. */
export interface WebhookHealth {
	/** A success was seen: whatever the table says about earlier failures no longer holds. */
	succeeded: boolean;
	/** The first failure after the last success seen here (ISO), if any. */
	failingSince: string | null;
	/** Messages whose first attempt failed since then. */
	failedMessages: number;
}

/** The same disable notice for the same webhook and moment gets the same event_id: a repeat adds nothing. */
function noticeEventId(webhookId: string, disabledAt: string): string {
	const hex = crypto.createHash("sha256").update(`webhook:disabled\0${webhookId}\0${disabledAt}`).digest("hex");
	return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-5${hex.slice(13, 16)}-a${hex.slice(17, 20)}-${hex.slice(20, 32)}`;
}

export const LifecycleMixin: DispatcherMixin = {
	actions: {
		/**
		 * POST /webhooks/{id}/recover (202): every failed delivery of the webhook created in the
		 * window gets one fresh attempt now (no automatic retries after it, like a hand retry).
		 * Bounded per call; repeating it while those attempts are pending schedules nothing twice.
		 */
		recover: {
			params: zodParams(RecoverParams),
			async handler(this: DispatcherThis, ctx: Context<RecoverParams, TenantMeta>): Promise<RecoverResult> {
				const customerId = this.customerOf(ctx);
				const { id } = ctx.params;
				await ctx.call("webhooks.find", { id });
				const since = new Date(ctx.params.since).toISOString();
				const until = new Date(ctx.params.until ?? Date.now()).toISOString();
				const failedInWindow = () =>
					this.db("deliveries").where({ webhook_id: id, customer_id: customerId, status: "failed" }).andWhere("created_at", ">=", since).andWhere("created_at", "<", until);
				const now = nowIso();
				let scheduled = 0;
				await this.db.transaction(async trx => {
					const rows: Array<{ id: string }> = await failedInWindow().transacting(trx).orderBy("created_at").limit(MAX_RECOVER_BATCH).select("id");
					for (const batch of chunks(rows.map(row => row.id), ROWS_PER_STATEMENT)) {
						scheduled += await trx("deliveries")
							.whereIn("id", batch)
							.andWhere({ status: "failed" })
							.update({ status: "pending", manual_retry: true, next_attempt_at: now, parked: false, lease_id: null, ...OUT_OF_ORDER_QUEUE, updated_at: now });
					}
				});
				const [{ count }] = await failedInWindow().count({ count: "*" });
				if (scheduled > 0) {
					this.logger.info(`Webhook ${id}: ${scheduled} failed deliveries recovered (${since} to ${until})`);
					this.requestClaim();
				}
				return { scheduled, remaining: Number(count) };
			},
		},
	},

	events: {
		"webhooks.updated": {
			async handler(this: DispatcherThis, ctx: Context<{ id?: unknown; active?: unknown }>) {
				const { id, active } = ctx.params ?? {};
				if (typeof id !== "string") return;
				try {
					if (active === false) await this.parkPending(id);
					// Re-enabled: its failure streak starts again from nothing.
					if (active === true) {
						this.health.delete(id);
						await this.db("webhook_failures").where({ webhook_id: id }).delete();
					}
				} catch (err) {
					this.logger.error(`Could not update the deliveries of webhook ${id} after a status change`, err);
				}
			},
		},

		"webhooks.disabled": {
			async handler(this: DispatcherThis, ctx: Context<unknown>) {
				const notice = WebhookDisabledEvent.safeParse(ctx.params);
				if (!notice.success) {
					this.logger.warn(`Ignored a malformed webhooks.disabled event: ${notice.error.issues.map(issue => `${issue.path.join(".") || "(event)"}: ${issue.message}`).join("; ")}`);
					return;
				}
				// Every dispatcher instance hears the broadcast; the notice's fixed event_id makes the
				// second and later writes no-ops.
				await this.notifyDisabled(notice.data).catch(err => this.logger.error(`Could not record the ${WEBHOOK_DISABLED.topic} notice of webhook ${notice.data.id}`, err));
			},
		},
	},

	methods: {
		/** Called for every attempt's outcome; cheap: it only folds the outcome into memory. */
		noteOutcome(this: DispatcherThis, webhookId: string, outcome: DeliveryOutcome, attemptCount: number): void {
			let health = this.health.get(webhookId);
			if (outcome.success) {
				// Recorded even when this instance saw no failure: another instance may have.
				if (health) Object.assign(health, { succeeded: true, failingSince: null, failedMessages: 0 });
				else this.health.set(webhookId, { succeeded: true, failingSince: null, failedMessages: 0 });
			} else {
				if (!health) this.health.set(webhookId, (health = { succeeded: false, failingSince: null, failedMessages: 0 }));
				health.failingSince ??= outcome.attemptedAt;
				if (attemptCount === 1) health.failedMessages += 1;
			}
			if (!this.healthTimer && !this.stopping) {
				this.healthTimer = setTimeout(() => {
					this.healthTimer = null;
					this.healthFlush = this.flushHealth();
				}, HEALTH_FLUSH_MS);
			}
		},

		/** Writes the folded outcomes, then disables the webhooks that have failed for long enough. */
		async flushHealth(this: DispatcherThis): Promise<void> {
			const seen = this.health;
			if (seen.size === 0) return;
			this.health = new Map();
			const now = nowIso();
			const failing: string[] = [];
			try {
				const cleared = [...seen].filter(([, health]) => health.succeeded).map(([id]) => id);
				for (const batch of chunks(cleared, ROWS_PER_STATEMENT)) await this.db("webhook_failures").whereIn("webhook_id", batch).delete();
				for (const [webhookId, health] of seen) {
					if (!health.failingSince) continue;
					failing.push(webhookId);
					await this.db("webhook_failures")
						.insert({ webhook_id: webhookId, failing_since: health.failingSince, failed_messages: health.failedMessages, updated_at: now })
						.onConflict("webhook_id")
						.merge({ failed_messages: this.db.raw("webhook_failures.failed_messages + ?", [health.failedMessages]), updated_at: now });
				}
				if (failing.length === 0) return;
				const threshold = new Date(Date.now() - this.config.WEBHOOK_DISABLE_AFTER).toISOString();
				const dead: Array<{ webhook_id: string }> = await this.db("webhook_failures")
					.whereIn("webhook_id", failing.slice(0, 1000))
					.andWhere("failing_since", "<=", threshold)
					.andWhere("failed_messages", ">=", MIN_FAILED_MESSAGES)
					.select("webhook_id");
				for (const { webhook_id: webhookId } of dead) await this.disableWebhook(webhookId, "failing");
			} catch (err) {
				this.logger.warn(`Could not record webhook failures: ${(err as Error).message}`);
			}
		},

		/** Asks the webhooks service to disable the webhook; parks its deliveries when it did. */
		async disableWebhook(this: DispatcherThis, webhookId: string, reason: "gone" | "failing"): Promise<void> {
			try {
				const result = await this.broker.call<DisableResult, { id: string; reason: string }>("webhooks.disable", { id: webhookId, reason });
				if (result.disabled && result.webhook) {
					this.targets.delete(webhookId);
					await this.parkPending(webhookId);
					// Not only on the broadcast, which a node that is reconnecting would miss; the
					// notice's fixed event_id makes the second write a no-op.
					const { id, customerId, name, url, disabled_at: disabledAt } = result.webhook;
					await this.notifyDisabled({ id, customerId, name, url, reason, disabled_at: disabledAt ?? new Date().toISOString() });
				}
				await this.db("webhook_failures").where({ webhook_id: webhookId }).delete();
				this.health.delete(webhookId);
			} catch (err) {
				// The next failure (or 410) tries again.
				this.logger.error(`Could not disable webhook ${webhookId} (${reason})`, err);
			}
		},

		/** Persists a webhook:disabled message and one delivery per subscribed webhook of the customer. */
		async notifyDisabled(this: DispatcherThis, notice: WebhookDisabledEvent): Promise<void> {
			const subscribers = await lookUpSubscribers(this.broker, notice.customerId, WEBHOOK_DISABLED.topic);
			const recipients = subscribers.filter(subscriber => subscriber.id !== notice.id);
			if (recipients.length === 0) return;
			const eventId = noticeEventId(notice.id, notice.disabled_at);
			const message: WebhookDisabledMessage = {
				type: "webhook:disabled",
				timestamp: notice.disabled_at,
				data: { webhook_id: notice.id, name: notice.name, url: notice.url, reason: notice.reason, disabled_at: notice.disabled_at },
			};
			const body = JSON.stringify(message);
			const now = nowIso();
			let created = 0;
			await this.db.transaction(async trx => {
				const inserted = await this.insertMessages(trx, [
					{ event_id: eventId, customer_id: notice.customerId, user_id: SYSTEM_USER, type: WEBHOOK_DISABLED.topic, body, occurred_at: notice.disabled_at, created_at: now },
				]);
				if (!inserted.has(eventId)) return;
				const rows: NewDeliveryRow[] = recipients.map(subscriber => ({
					id: timeOrderedUuid(),
					event_id: eventId,
					webhook_id: subscriber.id,
					customer_id: notice.customerId,
					status: "pending",
					next_attempt_at: now,
					lease_id: null,
					// Notices are not ordered (API.md): they go at once.
					order_key: null,
					created_at: now,
					updated_at: now,
				}));
				await this.insertDeliveries(trx, rows);
				created = rows.length;
			});
			if (created > 0) {
				this.requestClaim();
			}
		},
	},

	created(this: DispatcherThis) {
		this.health = new Map();
		this.healthTimer = null;
		this.healthFlush = Promise.resolve();
	},

	async stopped(this: DispatcherThis) {
		if (this.healthTimer) clearTimeout(this.healthTimer);
		this.healthTimer = null;
		// A flush the timer started may still be writing: the database must outlive it.
		await this.healthFlush;
		await this.flushHealth();
	},
};
