// Shapes of the dispatcher's API: the delivered message body (Standard Webhooks), the delivery
// log's parameters and answers, and the webhook test result.
import { z } from "zod";
import { PageQuery } from "./common";
import { WebhookId } from "./webhooks";
import { ORDER_STATUSES, type TaskingOrderStatusEvent } from "./events";

export const DELIVERY_STATUSES = ["pending", "succeeded", "failed", "cancelled"] as const;
export const DeliveryStatus = z.enum(DELIVERY_STATUSES, { message: `must be one of: ${DELIVERY_STATUSES.join(", ")}` });
export type DeliveryStatus = z.infer<typeof DeliveryStatus>;

export const ERROR_KINDS = ["http_status", "timeout", "unreachable", "blocked"] as const;

/** POST /webhooks/{id}/test */
export const TestWebhookParams = z.object({ id: WebhookId }).strict();
export type TestWebhookParams = z.infer<typeof TestWebhookParams>;

/** GET /webhooks/{id}/deliveries */
export const ListDeliveriesParams = PageQuery.extend({ id: WebhookId, status: DeliveryStatus.optional() }).strict();
export type ListDeliveriesParams = z.infer<typeof ListDeliveriesParams>;

/** GET /webhooks/{id}/deliveries/{delivery_id} and its retry. */
export const DeliveryParams = z.object({ id: WebhookId, delivery_id: WebhookId }).strict();
export type DeliveryParams = z.infer<typeof DeliveryParams>;

export const Attempt = z.object({
	attempt: z.number().int(),
	attempted_at: z.string(),
	success: z.boolean(),
	status_code: z.number().int().nullable(),
	error_kind: z.enum(ERROR_KINDS).nullable(),
	title: z.string().nullable(),
	detail: z.string(),
	duration_ms: z.number().int(),
});
export type Attempt = z.infer<typeof Attempt>;

export const Delivery = z.object({
	id: z.string(),
	webhook_id: z.string(),
	event_id: z.string(),
	/** The webhook-id header value: the same on every attempt of this delivery. */
	message_id: z.string(),
	type: z.string(),
	status: DeliveryStatus,
	attempt_count: z.number().int(),
	/** When the next attempt is due (pending only; null while the webhook is disabled). */
	next_attempt_at: z.string().nullable(),
	last_attempt_at: z.string().nullable(),
	last_status_code: z.number().int().nullable(),
	last_error_kind: z.enum(ERROR_KINDS).nullable(),
	/**
	 * With ordering per order: the earlier delivery of the same order that this one waits for
	 * (then `status` is pending and `next_attempt_at` null); null otherwise.
	 */
	waiting_for: z
		.string()
		.nullable()
		.describe("With ordering per_order: the id of the earlier delivery of the same order that this one waits for (then status is pending and next_attempt_at null); null otherwise"),
	created_at: z.string(),
	updated_at: z.string(),
});
export type Delivery = z.infer<typeof Delivery>;

export const DeliveryWithAttempts = Delivery.extend({
	/** The message exactly as delivered. */
	payload: z.unknown(),
	attempts: z.array(Attempt),
});
export type DeliveryWithAttempts = z.infer<typeof DeliveryWithAttempts>;

/** What `dispatcher.publish` answers once the message and its deliveries are persisted. */
export interface PublishResult {
	event_id: string;
	/** True when this event_id had been received before: nothing new was written. */
	duplicate: boolean;
	/** How many deliveries this call created (0 for a duplicate). */
	deliveries: number;
}

/** The test result: the webhook plus the outcome of one signed test request. */
export interface WebhookTestOutcome {
	success: boolean;
	status_code: number | null;
	title: "HTTP Status Error" | "Timeout" | "Unreachable" | "Blocked" | null;
	detail: string;
}

// What receivers get: the bodies of delivered messages, by `type`. The SDK's verifyWebhook
// returns these types; orderStatusMessage below builds the first one.

const OrderStatus = z.enum(ORDER_STATUSES);

/** The body of a `tasking:order_status` delivery. `details` keys of the event sit beside the core ones in `data`. */
export const OrderStatusMessage = z.object({
	type: z.literal("tasking:order_status"),
	timestamp: z.string(),
	data: z
		.object({
			order_id: z.string().describe("The tasking order"),
			status: OrderStatus.describe("The order's new status"),
			previous_status: OrderStatus.nullable().describe("Its status before, when the producer said"),
			user_id: z.string().describe("The order's owner"),
			order_name: z.string().nullable().describe("The order's name, when it has one"),
		})
		.catchall(z.unknown())
		.describe("A tasking order changed status. Keys of the event's `details` sit beside these ones; the ones above always win."),
});
export type OrderStatusMessage = z.infer<typeof OrderStatusMessage>;

/** The body of `POST /webhooks/{id}/test`. */
export const WebhookTestMessage = z.object({
	type: z.literal("webhook:test"),
	timestamp: z.string(),
	data: z
		.object({ webhook_id: z.string(), webhook_name: z.string(), message: z.string() })
		.describe("A test sent by POST /webhooks/{id}/test: nothing happened"),
});
export type WebhookTestMessage = z.infer<typeof WebhookTestMessage>;

/** The webhook-id header of a delivery: one per message per webhook, the same on every retry. */
export function messageIdOf(deliveryId: string): string {
	return `msg_${deliveryId}`;
}

/**
 * The Standard Webhooks body of a tasking order status event. The core keys come first and win
 * over keys of the same name in `details`; absent optional fields are null rather than missing,
 * so receivers see one stable shape.
 */
export function orderStatusMessage(event: TaskingOrderStatusEvent, type: string, timestamp: string): string {
	const data: OrderStatusMessage["data"] = {
		order_id: event.order_id,
		status: event.status,
		previous_status: event.previous_status ?? null,
		user_id: event.user_id,
		order_name: event.order_name ?? null,
	};
	for (const [key, value] of Object.entries(event.details ?? {})) {
		// defineProperty, not assignment: a "__proto__" key must stay a plain data key.
		if (!Object.hasOwn(data, key)) Object.defineProperty(data, key, { value, enumerable: true, writable: true, configurable: true });
	}
	return JSON.stringify({ type, timestamp, data });
}

/** A recover call schedules at most this many deliveries; `remaining` says how many are left. */
export const MAX_RECOVER_BATCH = 10_000;

const Instant = z.iso.datetime({ offset: true, message: "must be an ISO 8601 date-time, e.g. 2026-11-21T10:00:00Z" });

/** POST /webhooks/{id}/recover: every failed delivery created in [since, until) gets a fresh attempt. */
export const RecoverParams = z
	.object({
		id: WebhookId,
		since: Instant.describe("Start of the window (inclusive): deliveries created at or after this moment"),
		until: Instant.optional().describe("End of the window (exclusive); now when absent"),
	})
	.strict()
	.refine(value => new Date(value.since).getTime() <= Date.now(), { path: ["since"], message: "must not be in the future" })
	.refine(value => value.until === undefined || new Date(value.until) > new Date(value.since), { path: ["until"], message: "must be later than since" });
export type RecoverParams = z.infer<typeof RecoverParams>;

export const RecoverResult = z.object({
	scheduled: z.number().int().describe("Failed deliveries given a fresh attempt now"),
	remaining: z.number().int().describe(`Failed deliveries in the window left for another call (at most ${MAX_RECOVER_BATCH} per call)`),
});
export type RecoverResult = z.infer<typeof RecoverResult>;
