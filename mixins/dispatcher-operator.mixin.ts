// Operators' lookups on the dispatcher's tables (used by the REPL): which webhook and customer a
// delivery belongs to, and a webhook's failed deliveries since a time. The retries themselves go
// through dispatcher.retryDelivery, the same path as the API's.
import type { Context, Service, ServiceSchema, ServiceSettingSchema } from "moleculer";
import type { Knex } from "knex";
import { z } from "zod";
import { zodParams } from "./validation";
import { NotFoundError } from "../lib/errors";
import { WebhookId } from "../lib/schemas/webhooks";

const LocateParams = z.object({ delivery_id: WebhookId }).strict();
const FailedSinceParams = z
	.object({
		webhook_id: WebhookId,
		since: z.iso.datetime({ offset: true, message: "must be an ISO 8601 timestamp" }).transform(text => new Date(text).toISOString()),
		limit: z.number().int().min(1).max(10_000).default(1_000),
	})
	.strict();

type OperatorThis = Service & { db: Knex };

const dispatcherOperator: Partial<ServiceSchema<ServiceSettingSchema, OperatorThis>> = {
	actions: {
		/** → {delivery_id, webhook_id, customer_id, status}, or 404. */
		locateDelivery: {
			params: zodParams(LocateParams),
			async handler(this: OperatorThis, ctx: Context<z.output<typeof LocateParams>>) {
				const row = await this.db("deliveries").select("id", "webhook_id", "customer_id", "status").where({ id: ctx.params.delivery_id }).first();
				if (!row) throw new NotFoundError("Delivery");
				return { delivery_id: row.id as string, webhook_id: row.webhook_id as string, customer_id: row.customer_id as string, status: row.status as string };
			},
		},
		/** Ids of a webhook's failed deliveries last attempted at or after `since`, oldest first. */
		failedDeliveriesSince: {
			params: zodParams(FailedSinceParams),
			async handler(this: OperatorThis, ctx: Context<z.output<typeof FailedSinceParams>>): Promise<string[]> {
				const rows: Array<{ id: string }> = await this.db("deliveries")
					.select("id")
					.where({ webhook_id: ctx.params.webhook_id, status: "failed" })
					.andWhere("updated_at", ">=", ctx.params.since)
					.orderBy("updated_at")
					.limit(ctx.params.limit);
				return rows.map(row => row.id);
			},
		},
	},
};

export const DispatcherOperatorMixin = dispatcherOperator as Partial<ServiceSchema>;
