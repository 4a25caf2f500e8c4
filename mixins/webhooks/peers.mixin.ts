// What other services ask of the webhooks service (visibility "public": callable through the
// broker, never routed by the gateway): the dispatcher's `subscribers` and `resolve` (with the
// signing secrets and custom headers in clear) and `disable` (410 Gone or a long failure run), the
// ownership check `find`, and the operators' `owner` (no secret).
import type { Context } from "moleculer";
import { nowIso } from "../db.mixin";
import { zodParams } from "../validation";
import { NotFoundError } from "../../lib/errors";
import { openHeaders } from "../../lib/webhook-headers";
import {
	DisableParams,
	ResolveParams,
	SubscribersParams,
	WEBHOOK_EVENTS,
	WebhookIdParams,
	type DisableResult,
	type ResolvedWebhook,
	type Subscriber,
	type WebhookChangedEvent,
	type WebhookView,
} from "../../lib/schemas/webhooks";
import { PUBLIC_COLUMNS, type PublicWebhookRow, type TenantMeta, type WebhookRow, type WebhooksMixin, type WebhooksThis } from "./shared";

export const PeersMixin: WebhooksMixin = {
	actions: {
		/** The active webhooks of a customer subscribed to a topic, with their signing secrets. */
		subscribers: {
			visibility: "public",
			params: zodParams(SubscribersParams),
			async handler(this: WebhooksThis, ctx: Context<SubscribersParams>): Promise<Subscriber[]> {
				const { customerId, topic } = ctx.params;
				const rows: WebhookRow[] = await this.db("webhooks").where({ customer_id: customerId, active: true }).orderBy("created_at");
				return rows
					.filter(row => (JSON.parse(row.events) as string[]).includes(topic))
					.map(row => ({ id: row.id, customerId: row.customer_id, url: row.url, ...this.signingOf(row), headers: openHeaders(row, this.secretsKey), ordering: row.ordering, rateLimit: row.rate_limit }));
			},
		},

		/** The webhooks among `ids` that still exist, active or not; deleted ones are absent. */
		resolve: {
			visibility: "public",
			params: zodParams(ResolveParams),
			async handler(this: WebhooksThis, ctx: Context<ResolveParams>): Promise<ResolvedWebhook[]> {
				const ids = [...new Set(ctx.params.ids)];
				if (ids.length === 0) return [];
				const rows: WebhookRow[] = await this.db("webhooks").whereIn("id", ids);
				return rows.map(row => ({
					id: row.id,
					customerId: row.customer_id,
					url: row.url,
					active: Boolean(row.active),
					...this.signingOf(row),
					headers: openHeaders(row, this.secretsKey),
					ordering: row.ordering,
					rateLimit: row.rate_limit,
				}));
			},
		},

		/** Which customer a webhook belongs to, for operators' tools (the REPL); no secret. 404 if unknown. */
		owner: {
			visibility: "public",
			params: zodParams(WebhookIdParams),
			async handler(this: WebhooksThis, ctx: Context<WebhookIdParams>): Promise<{ id: string; customerId: string }> {
				const row: Pick<WebhookRow, "id" | "customer_id"> | undefined = await this.db("webhooks").select("id", "customer_id").where({ id: ctx.params.id }).first();
				if (!row) throw new NotFoundError("Webhook");
				return { id: row.id, customerId: row.customer_id };
			},
		},

		/**
		 * The dispatcher disables a webhook its receiver told to go away (410) or that kept failing.
		 * Only an active webhook changes, so a repeat (or a race of two dispatchers) announces once.
		 */
		disable: {
			visibility: "public",
			params: zodParams(DisableParams),
			async handler(this: WebhooksThis, ctx: Context<DisableParams>): Promise<DisableResult> {
				const { id, reason } = ctx.params;
				const now = nowIso();
				const changed = await this.db("webhooks").where({ id, active: true }).update({ active: false, disabled_reason: reason, disabled_at: now, updated_at: now });
				const row: (PublicWebhookRow & { customer_id: string }) | undefined = await this.db("webhooks").where({ id }).first([...PUBLIC_COLUMNS, "customer_id"]);
				if (!row) return { disabled: false, webhook: null };
				const view = this.present(row);
				if (changed === 1) {
					ctx.broadcast<WebhookChangedEvent>(WEBHOOK_EVENTS.updated, { id, customerId: row.customer_id, active: false, ordering: view.ordering, rateLimit: view.rate_limit });
					this.announceDisabled(ctx, row.customer_id, view);
				}
				return { disabled: changed === 1, webhook: { ...view, customerId: row.customer_id } };
			},
		},

		/** The public record for other services that check ownership (meta.customerId); 404 otherwise. */
		find: {
			visibility: "public",
			params: zodParams(WebhookIdParams),
			async handler(this: WebhooksThis, ctx: Context<WebhookIdParams, TenantMeta>): Promise<WebhookView> {
				return this.present(await this.findOwned(this.tenantOf(ctx), ctx.params.id));
			},
		},
	},
};
