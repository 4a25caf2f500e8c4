// The API's shapes, taken from the same zod schemas the service validates with (type-only
// imports: nothing of the server ends up in the bundle).
export type { WebhookView as Webhook, WebhookWithSecret, WebhookPage, WebhookOrdering } from "../../lib/schemas/webhooks";
export type { WebhookTopic } from "../../lib/schemas/topics";
export type { Delivery, DeliveryWithAttempts, Attempt, WebhookTestOutcome } from "../../lib/schemas/deliveries";
export type { WebhookStats, StatsBucket } from "../../lib/schemas/delivery-stats";
export type { UserDetails } from "../../lib/schemas/users";
export type { Problem, FieldProblem } from "../../lib/errors";
export type { WebClientConfig } from "../../lib/web-app";
