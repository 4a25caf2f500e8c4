// The dispatcher's HTTP API: the webhook test (one signed request, neither persisted nor
// retried) and the delivery log (list, detail with attempts, manual retry). Every action takes
// the tenant from ctx.meta and first asks the webhooks service whether the caller owns the
// webhook, so another customer's webhook or delivery answers 404 exactly like a missing one.
import crypto from "node:crypto";
import type { Context } from "moleculer";
import type { Knex } from "knex";
import { nowIso } from "../db.mixin";
import { zodParams } from "../validation";
import { NotFoundError } from "../../lib/errors";
import { buildPage, decodeCursor } from "../../lib/pagination";
import { TASKING_ORDER_STATUS_TOPIC } from "../../lib/schemas/events";
import type { ResolvedWebhook, WebhookView } from "../../lib/schemas/webhooks";
import {
	DeliveryParams,
	ListDeliveriesParams,
	TestWebhookParams,
	messageIdOf,
	type Delivery,
	type DeliveryWithAttempts,
	type WebhookTestOutcome,
} from "../../lib/schemas/deliveries";
import {
	isTrue,
	type AttemptRow,
	type DeliveryRow,
	type DispatcherMixin,
	type DispatcherThis,
	type MessageRow,
	type TenantMeta,
	OUT_OF_ORDER_QUEUE,
} from "./shared";

const DELIVERIES_PATH = (webhookId: string) => `/id/v3/webhooks/${webhookId}/deliveries`;
const TEST_EVENT_TYPE = "webhook:test";

export const DeliveryLogMixin: DispatcherMixin = {
	actions: {
		/** POST /webhooks/{id}/test: one signed test request, not persisted, not retried. */
		testWebhook: {
			params: zodParams(TestWebhookParams),
			async handler(this: DispatcherThis, ctx: Context<TestWebhookParams, TenantMeta>): Promise<WebhookView & WebhookTestOutcome> {
				const webhook: WebhookView = await ctx.call("webhooks.find", { id: ctx.params.id });
				const [target]: ResolvedWebhook[] = await ctx.call("webhooks.resolve", { ids: [webhook.id] });
				if (!target) throw new NotFoundError("Webhook");
				const body = JSON.stringify({
					type: TEST_EVENT_TYPE,
					timestamp: nowIso(),
					data: { webhook_id: webhook.id, webhook_name: webhook.name, message: "This is a test event. Answer 200 OK to pass the test." },
				});
				const outcome = await this.sender.send({
					url: target.url,
					messageId: messageIdOf(crypto.randomUUID()),
					body,
					secrets: target.secrets,
					headers: target.headers,
					timeoutMs: this.config.WEBHOOK_TEST_TIMEOUT,
				});
				return {
					...webhook,
					success: outcome.success,
					status_code: outcome.statusCode,
					title: outcome.title,
					detail: outcome.success ? "The URL answered 200 OK" : outcome.detail,
				};
			},
		},

		/** GET /webhooks/{id}/deliveries: newest first, keyset-paged, optionally by status. */
		listDeliveries: {
			params: zodParams(ListDeliveriesParams),
			async handler(this: DispatcherThis, ctx: Context<ListDeliveriesParams, TenantMeta>) {
				const customerId = this.customerOf(ctx);
				const { id, status, per_page: perPage, token } = ctx.params;
				const cursor = decodeCursor(token);
				const webhook: WebhookView = await ctx.call("webhooks.find", { id });

				const matching = (query: Knex.QueryBuilder) => {
					query.where({ "d.webhook_id": id, "d.customer_id": customerId });
					if (status) query.andWhere("d.status", status);
					return query;
				};
				const [{ count }] = await matching(this.db("deliveries as d")).count({ count: "*" });
				let query = matching(this.db("deliveries as d"))
					.join("delivery_messages as m", "m.event_id", "d.event_id")
					.select("d.*", "m.type")
					.orderBy([
						{ column: "d.created_at", order: "desc" },
						{ column: "d.id", order: "desc" },
					])
					.limit(perPage + 1);
				if (cursor) {
					query = query.andWhere(before =>
						before.where("d.created_at", "<", cursor.at).orWhere(tie => tie.where("d.created_at", "=", cursor.at).andWhere("d.id", "<", cursor.id)),
					);
				}
				const rows: DeliveryRow[] = await query;
				const waitingFor = await this.waitingForOf(rows);
				const statusQuery = status ? `&status=${status}` : "";
				const page = buildPage(
					rows,
					perPage,
					Number(count),
					row => ({ at: row.created_at, id: row.id }),
					row => this.present({ ...row, webhook_active: webhook.active }, waitingFor.get(row.id)),
					next => `${DELIVERIES_PATH(id)}?per_page=${perPage}${statusQuery}&token=${encodeURIComponent(next)}`,
				);
				return { deliveries: page.items, context: page.context, links: page.links };
			},
		},

		/** GET /webhooks/{id}/deliveries/{delivery_id}: the delivery, its payload and its attempts. */
		getDelivery: {
			params: zodParams(DeliveryParams),
			async handler(this: DispatcherThis, ctx: Context<DeliveryParams, TenantMeta>): Promise<DeliveryWithAttempts> {
				const row = await this.ownedDelivery(ctx);
				const message: Pick<MessageRow, "body"> = await this.db("delivery_messages").where({ event_id: row.event_id }).first("body");
				// The view lists the first attempt, kept in the delivery's row (migration 014), and the later ones.
				const attempts: AttemptRow[] = await this.db("delivery_attempt_log").where({ delivery_id: row.id }).orderBy("attempt");
				return {
					...this.present(row, (await this.waitingForOf([row])).get(row.id)),
					payload: JSON.parse(message.body) as unknown,
					// Never the response body: the log must not become a way to read other servers.
					attempts: attempts.map(attempt => ({
						attempt: attempt.attempt,
						attempted_at: attempt.attempted_at,
						success: isTrue(attempt.success),
						status_code: attempt.status_code,
						error_kind: attempt.error_kind,
						title: attempt.title,
						detail: attempt.detail,
						duration_ms: attempt.duration_ms,
					})),
				};
			},
		},

		/**
		 * POST /webhooks/{id}/deliveries/{delivery_id}/retry (202): an attempt as soon as possible.
		 * A pending delivery just becomes due now. A finished one gets one more attempt, without
		 * automatic retries after it. One already being attempted is left as it is. A waiting or
		 * finished one leaves its order's queue (API.md: a hand retry sends at once). A pending head
		 * stays the head: it goes at once all the same, and the statuses behind it must still wait
		 * for it. Out of its queue it would leave them headless, so that the next status taken in
		 * would become the head and go before them.
		 */
		retryDelivery: {
			params: zodParams(DeliveryParams),
			async handler(this: DispatcherThis, ctx: Context<DeliveryParams, TenantMeta>): Promise<Delivery> {
				const row = await this.ownedDelivery(ctx);
				const now = nowIso();
				if (row.status === "pending") {
					// Not while a lease is live: that would let a second worker attempt it concurrently.
					await this.db("deliveries")
						.where({ id: row.id, status: "pending" })
						.andWhere(free => free.whereNull("lease_id").orWhere("next_attempt_at", "<=", now))
						// Read in the statement: a waiting row may have been promoted to head since `row` was read.
						.update({ next_attempt_at: now, parked: false, lease_id: null, order_key: this.db.raw("CASE WHEN waiting THEN NULL ELSE order_key END"), waiting: false, updated_at: now });
				} else {
					await this.db("deliveries")
						.where({ id: row.id, status: row.status })
						.update({ status: "pending", manual_retry: true, next_attempt_at: now, parked: false, lease_id: null, ...OUT_OF_ORDER_QUEUE, updated_at: now });
				}
				this.requestClaim();
				const retried = await this.ownedDelivery(ctx);
				return this.present(retried, (await this.waitingForOf([retried])).get(retried.id));
			},
		},
	},

	methods: {
		customerOf(this: DispatcherThis, ctx: Context<unknown, TenantMeta>): string {
			const customerId = ctx.meta.customerId;
			if (typeof customerId !== "string" || customerId === "") throw new NotFoundError("Webhook");
			return customerId;
		},

		/** The delivery, if it belongs to this webhook and the caller owns the webhook; else 404. */
		async ownedDelivery(this: DispatcherThis, ctx: Context<DeliveryParams, TenantMeta>): Promise<DeliveryRow> {
			const customerId = this.customerOf(ctx);
			const { id, delivery_id: deliveryId } = ctx.params;
			const webhook: WebhookView = await ctx.call("webhooks.find", { id });
			const row: DeliveryRow | undefined = await this.db("deliveries as d")
				.join("delivery_messages as m", "m.event_id", "d.event_id")
				.where({ "d.id": deliveryId, "d.webhook_id": id, "d.customer_id": customerId })
				.first("d.*", "m.type");
			if (!row) throw new NotFoundError("Delivery");
			return { ...row, webhook_active: webhook.active };
		},

		present(this: DispatcherThis, row: DeliveryRow, waitingFor?: string): Delivery {
			const now = nowIso();
			const underWay = row.status === "pending" && row.lease_id !== null && row.next_attempt_at !== null && row.next_attempt_at > now;
			return {
				id: row.id,
				webhook_id: row.webhook_id,
				event_id: row.event_id,
				message_id: messageIdOf(row.id),
				type: row.type ?? TASKING_ORDER_STATUS_TOPIC,
				status: row.status,
				attempt_count: Number(row.attempt_count),
				// While leased the column holds the lease expiry, not a plan: the attempt is under way.
				next_attempt_at: row.status !== "pending" || underWay || row.webhook_active === false ? null : row.next_attempt_at,
				last_attempt_at: row.last_attempt_at,
				last_status_code: row.last_status_code === null ? null : Number(row.last_status_code),
				last_error_kind: row.last_error_kind,
				waiting_for: waitingFor ?? null,
				created_at: row.created_at,
				updated_at: row.updated_at,
			};
		},
	},
};
