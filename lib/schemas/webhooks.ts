// Webhook request and response shapes (API.md, "Webhooks"), plus the shapes of the internal
// actions and events that the dispatcher relies on. Request bodies are strict: an unknown
// field is a 422. The URL policy that needs configuration (allowed ranges) lives in
// lib/url-policy.ts and runs in the service, after these schemas.
import { z } from "zod";
import { displayName, PageContext, PageLink, PageQuery } from "./common";
import { CustomerId } from "./events";
import { MAX_WEBHOOK_URL_LENGTH } from "../url-policy";
import { MAX_CUSTOM_HEADERS, headerNameProblem, headerValueProblem } from "../webhook-headers";

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

/**
 * Custom request headers, name → value. Every problem is reported with the header's name in the
 * path (`headers.X-Api-Key`), so a client knows which one to fix. Names are kept as sent; two
 * names that differ only in case are one header, and refused.
 */
export const CustomHeaders = z
	.record(z.string(), z.unknown())
	.superRefine((headers, ctx) => {
		const names = Object.keys(headers);
		if (names.length > MAX_CUSTOM_HEADERS) ctx.addIssue({ code: "custom", message: `must hold at most ${MAX_CUSTOM_HEADERS} headers, not ${names.length}` });
		const seen = new Set<string>();
		for (const name of names.slice(0, MAX_CUSTOM_HEADERS * 5)) {
			const nameProblem = headerNameProblem(name);
			const valueProblem = nameProblem ? undefined : headerValueProblem(headers[name]);
			const duplicate = !nameProblem && seen.has(name.toLowerCase()) ? "is listed twice (header names are case-insensitive)" : undefined;
			seen.add(name.toLowerCase());
			const problem = nameProblem ?? duplicate ?? valueProblem;
			if (problem) ctx.addIssue({ code: "custom", path: [name], message: `header "${name.slice(0, 100)}" ${problem}` });
		}
	})
	.transform(headers => headers as Record<string, string>)
	.describe(`Custom request headers sent with every delivery (at most ${MAX_CUSTOM_HEADERS}; values up to 1 KiB, no CR/LF). Write-only: answers list only \`header_names\`.`);

/** API.md, "Ordering per order": per_order (the default) delivers one order's statuses one at a time, in order. */
export const WEBHOOK_ORDERINGS = ["per_order", "none"] as const;
export type WebhookOrdering = (typeof WEBHOOK_ORDERINGS)[number];
export const DEFAULT_ORDERING: WebhookOrdering = "per_order";

const ORDERING_DESCRIPTION =
	"per_order (the default): the statuses of one tasking order reach this webhook one at a time, in the order they happened, and a delivery still pending or retrying holds back only the later statuses of its own order. none: each status is sent as soon as it is taken in";

// One message for every wrong value (a number, null, another spelling): the two values are the answer.
export const WebhookOrderingField = z.enum(WEBHOOK_ORDERINGS, { message: `must be "per_order" (the default) or "none"` }).describe(ORDERING_DESCRIPTION);

/** API.md `rate_limit`: deliveries per second to one webhook, across every dispatcher instance. */
export const MIN_RATE_LIMIT = 1;
export const MAX_RATE_LIMIT = 10_000;

const RATE_LIMIT_DESCRIPTION =
	"At most this many deliveries per second to this webhook, whatever the number of dispatcher instances; null (the default) for no limit. Deliveries over the limit wait their turn: they never fail and never use up a retry because of it";

// One message for every wrong value (a string, a fraction, 0, a huge number): the range is the
// answer. `abort` stops at the first broken check, so a huge number is not reported twice.
const RATE_LIMIT_PROBLEM = `must be a whole number of deliveries per second from ${MIN_RATE_LIMIT} to ${MAX_RATE_LIMIT}, or null for no limit`;

export const RateLimitField = z
	.number({ message: RATE_LIMIT_PROBLEM })
	.int({ message: RATE_LIMIT_PROBLEM, abort: true })
	.min(MIN_RATE_LIMIT, { message: RATE_LIMIT_PROBLEM })
	.max(MAX_RATE_LIMIT, { message: RATE_LIMIT_PROBLEM })
	.nullable()
	.describe(RATE_LIMIT_DESCRIPTION);

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
		headers: CustomHeaders.optional(),
		ordering: WebhookOrderingField.default(DEFAULT_ORDERING),
		rate_limit: RateLimitField.default(null),
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
		headers: CustomHeaders.nullable().optional().describe("Replaces every custom header; `{}` or null removes them all"),
		ordering: WebhookOrderingField.optional(),
		rate_limit: RateLimitField.optional().describe(`${RATE_LIMIT_DESCRIPTION}. null removes the limit; left out, it stays as it is`),
		// Accepted here only so that the answer can say why it is refused.
		url: z.unknown().optional(),
	})
	.strict()
	.refine(value => value.url === undefined, { path: ["url"], message: URL_IS_FIXED, when: payload => isObject(payload.value) })
	.refine(
		value => ["name", "events", "event_types", "active", "headers", "ordering", "rate_limit", "url"].some(field => (value as Record<string, unknown>)[field] !== undefined),
		{ path: [], message: "send at least one of name, events (or event_types), active, headers, ordering, rate_limit", when: payload => isObject(payload.value) },
	)
	.refine(eventsAgree, EVENTS_DISAGREE)
	.transform(({ id, name, events, event_types, active, headers, ordering, rate_limit }) => ({
		id,
		name,
		events: events ?? event_types,
		active,
		headers: headers === null ? {} : headers,
		ordering,
		rate_limit,
	}));
export type UpdateWebhook = z.output<typeof UpdateWebhook>;

/** GET/DELETE /webhooks/{id}, POST /webhooks/{id}/rotate, webhooks.find. */
export const WebhookIdParams = z.object({ id: WebhookId }).strict();
export type WebhookIdParams = z.output<typeof WebhookIdParams>;

export const ListWebhooks = PageQuery.strict();
export type ListWebhooks = z.output<typeof ListWebhooks>;

export const DISABLED_REASONS = ["user", "gone", "failing"] as const;
export const DisabledReason = z.enum(DISABLED_REASONS);
export type DisabledReason = z.infer<typeof DisabledReason>;

export const WebhookView = z.object({
	id: z.uuid(),
	name: z.string(),
	url: z.string(),
	events: z.array(z.string()),
	active: z.boolean(),
	disabled_reason: DisabledReason.nullable().describe(
		"Null while active. `user`: switched off with PATCH; `gone`: the URL answered 410 Gone; `failing`: every attempt failed for WEBHOOK_DISABLE_AFTER",
	),
	disabled_at: z.string().nullable().describe("When it was disabled; null while active"),
	header_names: z.array(z.string()).describe("Names of the custom request headers; their values are never returned"),
	ordering: z.enum(WEBHOOK_ORDERINGS).describe(ORDERING_DESCRIPTION),
	rate_limit: z.number().int().min(MIN_RATE_LIMIT).max(MAX_RATE_LIMIT).nullable().describe(RATE_LIMIT_DESCRIPTION),
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

export const SubscribersParams = z.object({ customerId: CustomerId, topic: z.string().min(1).max(100) }).strict();
export type SubscribersParams = z.output<typeof SubscribersParams>;

export const ResolveParams = z.object({ ids: z.array(WebhookId).max(1000) }).strict();
export type ResolveParams = z.output<typeof ResolveParams>;

/** webhooks.disable: the dispatcher stops a webhook its receiver told to stop (410) or that kept failing. */
export const DisableParams = z.object({ id: WebhookId, reason: z.enum(["gone", "failing"]) }).strict();
export type DisableParams = z.output<typeof DisableParams>;

/** `disabled` is false when the webhook was already disabled (or is gone): nothing changed. */
export interface DisableResult {
	disabled: boolean;
	webhook: (WebhookView & { customerId: string }) | null;
}

/** Signing secrets in clear, newest first: the current one, then the previous one during its grace. */
export interface Subscriber {
	id: string;
	customerId: string;
	url: string;
	secrets: string[];
	/** When the previous secret's grace ends (then `secrets` loses it); null without one. Nobody may keep `secrets` past it. */
	previousSecretExpiresAt: string | null;
	/** Custom request headers in clear (decrypted for the dispatcher only). */
	headers: Record<string, string>;
	/** Always filled by the webhooks service, from its column (per_order unless the customer chose none). */
	ordering: WebhookOrdering;
	/** API.md `rate_limit`: at most this many deliveries a second to the webhook, across instances; null for none. Always filled by the webhooks service, from its column. */
	rateLimit: number | null;
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
	disabled: "webhooks.disabled",
} as const;

export interface WebhookChangedEvent {
	id: string;
	customerId: string;
	active: boolean;
	/** The webhook's ordering after the change (webhooks.updated); a change to "none" releases its waiting deliveries. */
	ordering?: WebhookOrdering;
	/** The webhook's rate_limit after the change (webhooks.updated; webhooks.created too); null for none. */
	rateLimit?: number | null;
}

export interface WebhookRemovedEvent {
	id: string;
	customerId: string;
}

export type WebhookRotatedEvent = WebhookRemovedEvent;

/** The body delivered to webhooks subscribed to the operational topic `webhook:disabled`. */
export const WebhookDisabledMessage = z.object({
	type: z.literal("webhook:disabled"),
	timestamp: z.string().describe("When the webhook was disabled"),
	data: z
		.object({
			webhook_id: z.uuid().describe("The webhook that was disabled"),
			name: z.string(),
			url: z.string(),
			reason: DisabledReason.describe("user (switched off), gone (its URL answered 410) or failing (every attempt failed for WEBHOOK_DISABLE_AFTER)"),
			disabled_at: z.string(),
		})
		.describe("One of the customer's webhooks was disabled"),
});
export type WebhookDisabledMessage = z.infer<typeof WebhookDisabledMessage>;

/** Broadcast when a webhook is disabled, whatever the reason (after webhooks.updated). */
export const WebhookDisabledEvent = z
	.object({
		id: WebhookId,
		customerId: CustomerId,
		name: z.string().max(MAX_WEBHOOK_NAME_LENGTH),
		url: WebhookUrl,
		reason: DisabledReason,
		disabled_at: z.iso.datetime(),
	})
	.strict();
export type WebhookDisabledEvent = z.infer<typeof WebhookDisabledEvent>;
