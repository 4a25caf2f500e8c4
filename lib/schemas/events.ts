// The `tasking.order_status` event that other microservices emit (API.md, "Events from other
// services"). Both the dispatcher and the notifier validate with this one schema.
import { z } from "zod";
import { CUSTOMER_ID_PATTERN, EXTERNAL_ID_PATTERN } from "../customers";

/** User ids and named customers' ids: the same shape the gateway accepts from token claims. */
export const ExternalId = z.string().regex(EXTERNAL_ID_PATTERN, "must be 1..200 characters of letters, digits and . @ | : + - _");

/** A customer id: a named customer's, or "~" and the id of a user who is their own customer (lib/customers.ts). */
export const CustomerId = z
	.string()
	.regex(CUSTOMER_ID_PATTERN, "must be 1..200 characters of letters, digits and . @ | : + - _, or ~ and a user id (a user who is their own customer)");

export const ORDER_STATUSES = ["committed", "staged", "in progress", "fulfilled", "failed", "rejected", "cancelled", "expired"] as const;
export type OrderStatus = (typeof ORDER_STATUSES)[number];

/** Statuses that produce an email to an opted-in owner. */
export const EMAIL_STATUSES: ReadonlySet<OrderStatus> = new Set<OrderStatus>(["fulfilled", "failed", "expired"]);

const MAX_DETAILS_BYTES = 16 * 1024;

const OrderStatusValue = z
	.string()
	.max(50)
	.transform(text => text.trim().toLowerCase())
	.pipe(z.enum(ORDER_STATUSES, { message: `must be one of: ${ORDER_STATUSES.join(", ")}` }));

/**
 * Unknown top-level fields are ignored (tolerant reader): producers may add fields without
 * breaking consumers. Everything we use is checked.
 */
export const TaskingOrderStatusEvent = z.object({
	event_id: z.uuid({ message: "must be a UUID" }).optional(),
	customer_id: CustomerId.optional(),
	user_id: ExternalId,
	order_id: z.string().trim().min(1).max(200),
	status: OrderStatusValue,
	previous_status: OrderStatusValue.optional(),
	order_name: z.string().max(500).optional(),
	occurred_at: z.iso.datetime({ offset: true, message: "must be an ISO 8601 timestamp" }).optional(),
	details: z
		.record(z.string(), z.unknown())
		.refine(details => Buffer.byteLength(JSON.stringify(details)) <= MAX_DETAILS_BYTES, `must serialise to at most ${MAX_DETAILS_BYTES} bytes`)
		.optional(),
});
export type TaskingOrderStatusEvent = z.output<typeof TaskingOrderStatusEvent>;
/** What a producer sends (before defaults and normalisation). */
export type TaskingOrderStatusInput = z.input<typeof TaskingOrderStatusEvent>;

export const TASKING_ORDER_STATUS_EVENT = "tasking.order_status";
export const TASKING_ORDER_STATUS_TOPIC = "tasking:order_status";

/**
 * An object event without event_id, with the id `makeId` gives it: set before the event is handed
 * on, so that every consumer keys it the same way. Anything else is returned as it is (it fails
 * validation later, where it is recorded as rejected).
 */
export function withEventId(payload: unknown, makeId: () => string): unknown {
	if (!payload || typeof payload !== "object" || Array.isArray(payload)) return payload;
	if ((payload as { event_id?: unknown }).event_id !== undefined) return payload;
	return { ...payload, event_id: makeId() };
}

/** POST /events/tasking.order_status takes at most this many events in one list. */
export const MAX_EVENTS_PER_REQUEST = 100;

/**
 * The body of POST /events/tasking.order_status, as documented: one event or a list. The gateway
 * checks each event of a list on its own, so that every problem names its index.
 */
export const PublishOrderStatusBody = z.union([
	TaskingOrderStatusEvent,
	z.array(TaskingOrderStatusEvent).min(1).max(MAX_EVENTS_PER_REQUEST).describe(`At most ${MAX_EVENTS_PER_REQUEST} events, stored all or none`),
]);
export type PublishOrderStatusInput = z.input<typeof PublishOrderStatusBody>;

/** The 202 answer: the event_id of every event, in the order sent (generated where none was given). */
export const PublishedEvents = z.object({
	event_ids: z.array(z.uuid()).describe("One per event sent, in the same order"),
});
export type PublishedEvents = z.output<typeof PublishedEvents>;
