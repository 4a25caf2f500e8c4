// Dispatcher parking: what becomes of the pending deliveries of a webhook that is disabled or
// removed. They are parked when the webhook is disabled (parkPending, called by lifecycle.mixin.ts
// on webhooks.updated and when it disables a failing webhook); they resume once it is active
// again (worker.mixin.ts on webhooks.updated, or the poll's recheck in claims.mixin.ts, in case
// that event was missed), and a removed webhook's are cancelled.
import { nowIso } from "../db.mixin";
import { resolveWebhooks, type DispatcherMixin, type DispatcherThis } from "./shared";

export const ParkingMixin: DispatcherMixin = {
	methods: {
		/**
		 * Parks a disabled webhook's pending deliveries now, so that none shows a next attempt.
		 * A row under a live lease keeps its lease_id: the attempt in flight still writes its
		 * result, and the result write sees the row parked and keeps it so (a retry it would have
		 * scheduled waits for the webhook instead). Without that, an attempt that ended just after
		 * the disable left a pending retry behind, due while the webhook was off.
		 */
		async parkPending(this: DispatcherThis, webhookId: string): Promise<number> {
			const now = nowIso();
			// Waiting rows stay as they are: their queue's head is parked, and holds them.
			return this.db("deliveries")
				.where({ webhook_id: webhookId, status: "pending", parked: false, waiting: false })
				.update({
					parked: true,
					next_attempt_at: null,
					lease_id: this.db.raw("CASE WHEN next_attempt_at > ? THEN lease_id ELSE NULL END", [now]),
					updated_at: now,
				});
		},

		/** Parked deliveries whose webhook is active again resume; those of deleted webhooks end. */
		async recheckParked(this: DispatcherThis): Promise<void> {
			try {
				const rows: Array<{ webhook_id: string }> = await this.db("deliveries").whereRaw("parked").andWhereRaw("status = 'pending'").distinct("webhook_id").limit(1000);
				if (rows.length === 0) return;
				const ids = rows.map(row => row.webhook_id);
				const found = await resolveWebhooks(this.broker, ids);
				const byId = new Map(found.map(webhook => [webhook.id, webhook]));
				for (const id of ids) {
					const webhook = byId.get(id);
					if (!webhook) await this.cancelPending(id);
					else if (webhook.active) await this.resumeParked(id);
				}
			} catch (err) {
				this.logger.warn(`Re-checking parked deliveries failed, will try again: ${(err as Error).message}`);
			}
		},

		/**
		 * A parked row that still has a lease_id was parked while an attempt was in flight (see
		 * parkPending): it becomes due only when that lease has surely ended, never now, or a
		 * second worker could attempt it alongside the first.
		 */
		async resumeParked(this: DispatcherThis, webhookId: string): Promise<void> {
			const now = nowIso();
			const leaseEnded = new Date(Date.now() + this.config.DELIVERY_LEASE).toISOString();
			const resumed = await this.db("deliveries")
				.where({ webhook_id: webhookId, status: "pending", parked: true })
				.update({ parked: false, next_attempt_at: this.db.raw("CASE WHEN lease_id IS NULL THEN ? ELSE ? END", [now, leaseEnded]), updated_at: now });
			if (resumed > 0) {
				this.logger.info(`Webhook ${webhookId} is active again: ${resumed} parked deliveries resumed`);
				this.requestClaim();
			}
		},

		/** Cancels every pending delivery of a webhook; a lease in flight loses its write. */
		async cancelPending(this: DispatcherThis, webhookId: string): Promise<number> {
			const now = nowIso();
			return this.db("deliveries")
				.where({ webhook_id: webhookId, status: "pending" })
				.update({ status: "cancelled", next_attempt_at: null, lease_id: null, parked: false, updated_at: now });
		},
	},
};
