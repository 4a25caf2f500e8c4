// The source of the SDK's types, derived from the zod schemas that the service itself validates
// and answers with (lib/schemas): the request types are the schemas' input, the answers their
// output. sdk/scripts/generate-types.ts expands them into src/api-types.ts, which is what the
// SDK uses, so that the package imports nothing from outside itself.
import type { z } from "zod";
import type { WebhookTopic } from "../../lib/schemas/topics";
import type { CreateWebhook, UpdateWebhook, WebhookDisabledMessage, WebhookView, WebhookWithSecret as WebhookWithSecretSchema } from "../../lib/schemas/webhooks";
import type { WebhookStats as WebhookStatsSchema } from "../../lib/schemas/delivery-stats";
import type {
	Delivery as DeliverySchema,
	DeliveryStatus as DeliveryStatusSchema,
	DeliveryWithAttempts as DeliveryWithAttemptsSchema,
	OrderStatusMessage,
	RecoverParams,
	RecoverResult as RecoverResultSchema,
	WebhookTestMessage,
	WebhookTestOutcome,
} from "../../lib/schemas/deliveries";
import type { NotificationsUpdate, UserDetails as UserDetailsSchema } from "../../lib/schemas/users";
import type { PageContext, PageLink } from "../../lib/schemas/common";
import type { PublishedEvents as PublishedEventsSchema, TaskingOrderStatusEvent } from "../../lib/schemas/events";
import type { FieldProblem as FieldProblemInterface, Problem as ProblemInterface } from "../../lib/errors";

/** Interfaces print by name; this makes the compiler spell every type out as a literal. */
type DeepPlain<T> = T extends (infer Item)[] ? DeepPlain<Item>[] : T extends object ? { [K in keyof T]: DeepPlain<T[K]> } : T;

export type EventTopic = z.infer<typeof WebhookTopic>;

export type Webhook = z.infer<typeof WebhookView>;
/** What `webhooks.create` and `webhooks.rotate` answer: the only time the secret is shown. */
export type WebhookWithSecret = Webhook & DeepPlain<Omit<z.infer<typeof WebhookWithSecretSchema>, keyof Webhook>>;
export type CreateWebhookInput = z.input<typeof CreateWebhook>;
/** Any of name, events (or event_types), active, headers, ordering, rate_limit. The URL cannot change. */
export type UpdateWebhookInput = Omit<z.input<typeof UpdateWebhook>, "id" | "url">;
export type WebhookTestResult = Webhook & DeepPlain<WebhookTestOutcome>;

/** POST /webhooks/{id}/recover: the window of failed deliveries to attempt again. */
export type RecoverInput = Omit<z.input<typeof RecoverParams>, "id">;
export type RecoverResult = z.infer<typeof RecoverResultSchema>;
/** GET /webhooks/{id}/stats: deliveries and attempts per hour. */
export type WebhookStats = z.infer<typeof WebhookStatsSchema>;

export type DeliveryStatus = z.infer<typeof DeliveryStatusSchema>;
export type Delivery = z.infer<typeof DeliverySchema>;
export type DeliveryWithAttempts = Delivery & DeepPlain<Omit<z.infer<typeof DeliveryWithAttemptsSchema>, keyof Delivery>>;

export type UserDetails = z.infer<typeof UserDetailsSchema>;
/** The `notifications` list of PUT /user/settings: `[{category, settings: [{topic, email}]}]`. */
export type NotificationsInput = NonNullable<z.input<typeof NotificationsUpdate>>;

/** One tasking order status event, as a producer sends it (POST /events/tasking.order_status). */
export type OrderStatusEventInput = z.input<typeof TaskingOrderStatusEvent>;
/** The 202 answer: every event's event_id, in the order sent. */
export type PublishedEvents = z.infer<typeof PublishedEventsSchema>;

export type PageInfo = z.infer<typeof PageContext>;
export type Link = z.infer<typeof PageLink>;
export type FieldProblem = DeepPlain<FieldProblemInterface>;
export type Problem = DeepPlain<ProblemInterface>;

/** A verified delivery's body, discriminated by `type`. */
export type WebhookEvent = OrderStatusMessage | WebhookTestMessage | WebhookDisabledMessage;
export type OrderStatusEvent = OrderStatusMessage;
export type WebhookTestEvent = WebhookTestMessage;
export type WebhookDisabledEvent = WebhookDisabledMessage;
/** The types of delivery the service describes (the catalogue's topics and `webhook:test`). */
export type WebhookEventType = WebhookEvent["type"];

/** The `data` of a `tasking:order_status` delivery: the core keys, and the event's `details` beside them. */
export type OrderStatusData = OrderStatusMessage["data"];
/** The `data` of a `webhook:disabled` delivery. */
export type WebhookDisabledData = WebhookDisabledMessage["data"];
/** The `data` of a `webhook:test` delivery. */
export type WebhookTestData = WebhookTestMessage["data"];
