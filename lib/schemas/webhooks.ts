// Webhook request and response shapes (API.md, "Webhooks"), plus the shapes of the internal
// actions and events that the dispatcher relies on. Request bodies are strict: an unknown
// field is a 422. The URL policy that needs configuration (allowed ranges) lives in
// lib/url-policy.ts and runs in the service, after these schemas.
import { z } from "zod";
import { displayName, PageContext, PageLink, PageQuery } from "./common";
import { ExternalId } from "./events";
import { MAX_WEBHOOK_URL_LENGTH } from "../url-policy";

export const MAX_WEBHOOK_NAME_LENGTH = 100;
export const MAX_EVENTS_PER_WEBHOOK = 50;

/** Ids are compared in lower case, so an upper-case copy of an id finds the same webhook. */
export const WebhookId = z
	.uuid({ message: "must be a UUID" })
	.transform(id => id.toLowerCase());

export const WebhookName = displayName(MAX_WEBHOOK_NAME_LENGTH);

export const WebhookUrl = z.string().max(MAX_WEBHOOK_URL_LENGTH, `must be at most ${MAX_WEBHOOK_URL_LENGTH} characters`);

/** Topic names are checked against the catalogue by the service; here only their shape. */
export const EventList = z
	.array(z.string().min(1, "must not be empty").max(100, "must be at most 100 characters"))
	.min(1, "must list at least one event topic")
	.max(MAX_EVENTS_PER_WEBHOOK, `must list at most ${MAX_EVENTS_PER_WEBHOOK} event topics`)
	.transform(topics => [...new Set(topics)]);

interface EventFields {
	events?: string[];
	event_types?: string[];
}

const sameTopics = (a: string[], b: string[]) => a.length === b.length && a.every(topic => b.includes(topic));

// `event_types` is the spec's sample-request name for `events`; either may be sent, not both
// with different contents.
const eventsAgree = (value: EventFields) => !value.events || !value.event_types || sameTopics(value.events, value.event_types);
const EVENTS_DISAGREE = { path: ["event_types"], message: "events and event_types were both sent with different topics: send only one" };

const isObject = (value: unknown) => typeof value === "object" && value !== null;

export const CreateWebhook = z
	.object({
		name: WebhookName,
		url: WebhookUrl,
		events: EventList.optional(),
		event_types: EventList.optional(),
	})
	.strict()
	// `when` runs this even if other fields failed, so the client hears about every problem at once.
	.refine(value => value.events !== undefined || value.event_types !== undefined, {
		path: ["events"],
		message: "is required: list the event topics (events or event_types)",
		when: payload => isObject(payload.value),
	})
	.refine(eventsAgree, EVENTS_DISAGREE)
	.transform(({ events, event_types, ...rest }) => ({ ...rest, events: (events ?? event_types) as string[] }));
export type CreateWebhook = z.output<typeof CreateWebhook>;

export const URL_IS_FIXED = "cannot be changed after creation: create a new webhook with the new URL, then delete this one";

export const UpdateWebhook = z
	.object({
		id: WebhookId,
		name: WebhookName.optional(),
		events: EventList.optional(),
		event_types: EventList.optional(),
		active: z.boolean().optional(),
		// Accepted here only so that the answer can say why it is refused.
		url: z.unknown().optional(),
	})
	.strict()
	.refine(value => value.url === undefined, { path: ["url"], message: URL_IS_FIXED, when: payload => isObject(payload.value) })
	.refine(
		value => ["name", "events", "event_types", "active", "url"].some(field => (value as Record<string, unknown>)[field] !== undefined),
		{ path: [], message: "send at least one of name, events (or event_types), active", when: payload => isObject(payload.value) },
	)
	.refine(eventsAgree, EVENTS_DISAGREE)
	.transform(({ id, name, events, event_types, active }) => ({ id, name, events: events ?? event_types, active }));
export type UpdateWebhook = z.output<typeof UpdateWebhook>;

/** GET/DELETE /webhooks/{id}, POST /webhooks/{id}/rotate, webhooks.find. */
export const WebhookIdParams = z.object({ id: WebhookId }).strict();
export type WebhookIdParams = z.output<typeof WebhookIdParams>;

export const ListWebhooks = PageQuery.strict();
export type ListWebhooks = z.output<typeof ListWebhooks>;

export const WebhookView = z.object({
	id: z.uuid(),
	name: z.string(),
	url: z.string(),
	events: z.array(z.string()),
	active: z.boolean(),
	created_at: z.string(),
	updated_at: z.string(),
});
export type WebhookView = z.infer<typeof WebhookView>;

/** The answer of create and rotate: the only responses that carry the secret. */
export const WebhookWithSecret = WebhookView.extend({ secret: z.string() });
export type WebhookWithSecret = z.infer<typeof WebhookWithSecret>;

export const WebhookPage = z.object({
	webhooks: z.array(WebhookView),
	context: PageContext,
	links: z.array(PageLink),
});
export type WebhookPage = z.infer<typeof WebhookPage>;

// Internal actions (service contracts in CONTRIBUTING.md).

export const SubscribersParams = z.object({ customerId: ExternalId, topic: z.string().min(1).max(100) }).strict();
export type SubscribersParams = z.output<typeof SubscribersParams>;

export const ResolveParams = z.object({ ids: z.array(WebhookId).max(1000) }).strict();
export type ResolveParams = z.output<typeof ResolveParams>;

/** Signing secrets in clear, newest first: the current one, then the previous one during its grace. */
export interface Subscriber {
	id: string;
	customerId: string;
	url: string;
	secrets: string[];
}

export interface ResolvedWebhook extends Subscriber {
	active: boolean;
}

// Events.

export const WEBHOOK_EVENTS = {
	created: "webhooks.created",
	updated: "webhooks.updated",
	removed: "webhooks.removed",
	rotated: "webhooks.rotated",
} as const;

export interface WebhookChangedEvent {
	id: string;
	customerId: string;
	active: boolean;
}

export interface WebhookRemovedEvent {
	id: string;
	customerId: string;
}

export type WebhookRotatedEvent = WebhookRemovedEvent;
