import { z } from "zod";

export const TOPIC_PATTERN = /^[a-z][a-z0-9_]*:[a-z][a-z0-9_]*$/;

export const TopicName = z.string().max(100).regex(TOPIC_PATTERN, "must look like <category>:<name>, lower case");

export const TopicRegistration = z
	.object({
		topic: TopicName,
		category: z.string().min(1).max(50).regex(/^[a-z][a-z0-9_]*$/, "must be a lower-case identifier"),
		name: z.string().trim().min(1).max(200),
		description: z.string().trim().min(1).max(1000),
		email: z.boolean().default(false),
		webhooks: z.boolean().default(true),
	})
	.strict()
	.refine(value => value.topic.startsWith(`${value.category}:`), { message: "topic must start with its category", path: ["topic"] });
export type TopicRegistration = z.output<typeof TopicRegistration>;

/** An entry of GET /webhooks/events. */
export const WebhookTopic = z.object({ topic: z.string(), name: z.string(), description: z.string() });
export type WebhookTopic = z.infer<typeof WebhookTopic>;

/** The full catalogue entry other services use. */
export interface CatalogueTopic {
	topic: string;
	category: string;
	name: string;
	description: string;
	email: boolean;
	webhooks: boolean;
}

export const TASKING_ORDER_STATUS: TopicRegistration = {
	topic: "tasking:order_status",
	category: "tasking",
	name: "Tasking order status updates",
	description: "Notifications for all tasking order updates",
	email: true,
	webhooks: true,
};

/** Operational topic: a webhook of the customer was disabled (410 Gone, failing, or by a user). */
export const WEBHOOK_DISABLED: TopicRegistration = {
	topic: "webhook:disabled",
	category: "webhook",
	name: "Webhook disabled",
	description: "One of your webhooks was disabled: its URL answered 410 Gone, every attempt failed for days, or a user switched it off",
	email: false,
	webhooks: true,
};
