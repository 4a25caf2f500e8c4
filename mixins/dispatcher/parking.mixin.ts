// Dispatcher parking: what becomes of the pending deliveries of a webhook that is disabled or
// removed. lifecycle.mixin.ts parks them when the webhook is disabled (parkPending); here they
// resume once it is active again (worker.mixin.ts on webhooks.updated, or the poll's recheck in
// claims.mixin.ts, in case that event was missed), and a removed webhook's are cancelled.
import { nowIso } from "../db.mixin";
import { resolveWebhooks, type DispatcherMixin, type DispatcherThis } from "./shared";

export const ParkingMixin: DispatcherMixin = {
	methods: {
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
