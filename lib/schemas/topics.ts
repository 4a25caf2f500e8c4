import { z } from "zod";
import { eventDataJsonSchema, UNDESCRIBED_DATA } from "./event-payloads";
import type { JsonSchema } from "../openapi/json-schema";

export const TOPIC_PATTERN = /^[a-z][a-z0-9_]*:[a-z][a-z0-9_]*$/;

const MAX_SCHEMA_BYTES = 64 * 1024;

/** A JSON Schema as a registering service gives it: an object, kept as sent. */
const DataSchema = z
	.record(z.string(), z.unknown())
	.refine(schema => Buffer.byteLength(JSON.stringify(schema)) <= MAX_SCHEMA_BYTES, `must serialise to at most ${MAX_SCHEMA_BYTES} bytes`);

export const TopicName = z.string().max(100).regex(TOPIC_PATTERN, "must look like <category>:<name>, lower case");

export const TopicRegistration = z
	.object({
		topic: TopicName,
		category: z.string().min(1).max(50).regex(/^[a-z][a-z0-9_]*$/, "must be a lower-case identifier"),
		name: z.string().trim().min(1).max(200),
		description: z.string().trim().min(1).max(1000),
		email: z.boolean().default(false),
		webhooks: z.boolean().default(true),
		/** JSON Schema of the `data` of this topic's deliveries; absent: not described (any data). */
		schema: DataSchema.optional(),
	})
	.strict()
	.refine(value => value.topic.startsWith(`${value.category}:`), { message: "topic must start with its category", path: ["topic"] });
export type TopicRegistration = z.output<typeof TopicRegistration>;

/** An entry of GET /webhooks/events. */
export const WebhookTopic = z.object({
	topic: z.string(),
	name: z.string(),
	description: z.string(),
	schema: z
		.record(z.string(), z.unknown())
		.describe("JSON Schema (draft 2020-12) of the `data` of this topic's deliveries, generated from the schema the service builds them with"),
});
export type WebhookTopic = z.infer<typeof WebhookTopic>;

/** The full catalogue entry other services use. */
export interface CatalogueTopic {
	topic: string;
	category: string;
	name: string;
	description: string;
	email: boolean;
	webhooks: boolean;
	/** JSON Schema of the `data` of its deliveries. */
	schema: JsonSchema;
}

export { UNDESCRIBED_DATA };

export const TASKING_ORDER_STATUS: TopicRegistration = {
	topic: "tasking:order_status",
	category: "tasking",
	name: "Tasking order status updates",
	description: "Notifications for all tasking order updates",
	email: true,
	webhooks: true,
	schema: eventDataJsonSchema("tasking:order_status"),
};

/** Operational topic: a webhook of the customer was disabled (410 Gone, failing, or by a user). */
export const WEBHOOK_DISABLED: TopicRegistration = {
	topic: "webhook:disabled",
	category: "webhook",
	name: "Webhook disabled",
	description: "One of your webhooks was disabled: its URL answered 410 Gone, every attempt failed for days, or a user switched it off",
	email: false,
	webhooks: true,
	schema: eventDataJsonSchema("webhook:disabled"),
};
