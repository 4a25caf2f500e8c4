// The dispatcher's webhook health figures (GET /webhooks/{id}/stats): deliveries and attempts
// per hour over a window, grouped and counted by the database. Mixed into the dispatcher,
// which owns the delivery tables; kept apart so the service file stays a map of delivery itself.
import type { Context, ServiceSchema, ServiceSettingSchema } from "moleculer";
import type { DbServiceThis } from "../db.mixin";
import { zodParams } from "../validation";
import { NotFoundError } from "../../lib/errors";
import { WebhookStatsParams, type StatsBucket, type WebhookStats } from "../../lib/schemas/delivery-stats";
import type { DeliveryStatus } from "../../lib/schemas/deliveries";
import { rowsOf } from "../../lib/sql-rows";

const HOUR_MS = 3_600_000;
const WINDOW_HOURS: Record<WebhookStatsParams["window"], number> = { "24h": 24 };
// Timestamps are stored as ISO 8601 text, so the first 13 characters ("2026-11-21T10") name the
// hour on both engines, and the grouping stays in the database.
const HOUR_OF = (column: string) => `substr(${column}, 1, 13)`;

interface StatusCountRow {
	hour: string;
	status: DeliveryStatus;
	count: number | string;
}

interface AttemptCountRow {
	hour: string;
	success: boolean | number;
	count: number | string;
}

type Counts = Omit<StatsBucket, "start">;
const emptyCounts = (): Counts => ({ succeeded: 0, failed: 0, pending: 0, cancelled: 0, attempts_succeeded: 0, attempts_failed: 0 });

export const DeliveryStatsMixin: Partial<ServiceSchema<ServiceSettingSchema, DbServiceThis>> = {
	actions: {
		/** GET /webhooks/{id}/stats?window=24h: per-hour counts, oldest hour first. */
		webhookStats: {
			params: zodParams(WebhookStatsParams),
			async handler(this: DbServiceThis, ctx: Context<WebhookStatsParams, { customerId?: string }>): Promise<WebhookStats> {
				const customerId = ctx.meta.customerId;
				if (typeof customerId !== "string" || customerId === "") throw new NotFoundError("Webhook");
				const { id, window } = ctx.params;
				// 404 for another customer's webhook, exactly like a missing one.
				await ctx.call("webhooks.find", { id });

				const hours = WINDOW_HOURS[window];
				const currentHour = Math.floor(Date.now() / HOUR_MS) * HOUR_MS;
				const from = new Date(currentHour - (hours - 1) * HOUR_MS).toISOString();
				const to = new Date(currentHour + HOUR_MS).toISOString();

				const [deliveryRows, attemptRows] = await Promise.all([
					this.db.raw(
						`select ${HOUR_OF("created_at")} as hour, status, count(*) as count from deliveries
						 where webhook_id = ? and customer_id = ? and created_at >= ? and created_at < ?
						 group by ${HOUR_OF("created_at")}, status`,
						[id, customerId, from, to],
					),
					// A first attempt is kept in its delivery's row (migration 014), later ones in delivery_attempts.
					this.db.raw(
						`select hour, success, count(*) as count from (
							select ${HOUR_OF("d.first_attempt_at")} as hour, d.first_attempt_success as success from deliveries d
							 where d.webhook_id = ? and d.customer_id = ? and d.first_attempt_success is not null and d.first_attempt_at >= ? and d.first_attempt_at < ?
							union all
							select ${HOUR_OF("a.attempted_at")}, a.success from delivery_attempts a join deliveries d on d.id = a.delivery_id
							 where d.webhook_id = ? and d.customer_id = ? and a.attempted_at >= ? and a.attempted_at < ?
						) attempts group by hour, success`,
						[id, customerId, from, to, id, customerId, from, to],
					),
				]);

				const byHour = new Map<string, Counts>();
				const countsAt = (hour: string) => {
					let counts = byHour.get(hour);
					if (!counts) byHour.set(hour, (counts = emptyCounts()));
					return counts;
				};
				for (const row of rowsOf<StatusCountRow>(deliveryRows)) countsAt(row.hour)[row.status] += Number(row.count);
				for (const row of rowsOf<AttemptCountRow>(attemptRows)) {
					countsAt(row.hour)[row.success ? "attempts_succeeded" : "attempts_failed"] += Number(row.count);
				}

				const totals = emptyCounts();
				const buckets: StatsBucket[] = [];
				for (let i = 0; i < hours; i += 1) {
					const start = new Date(Date.parse(from) + i * HOUR_MS).toISOString();
					const counts = byHour.get(start.slice(0, 13)) ?? emptyCounts();
					for (const key of Object.keys(totals) as Array<keyof Counts>) totals[key] += counts[key];
					buckets.push({ start, ...counts });
				}
				return { webhook_id: id, window, from, to, buckets, totals };
			},
		},
	},
};
