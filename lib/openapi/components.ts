// The shared parts of the OpenAPI document, under `components`: the named response schemas that
// operations refer to, and one problem-details response per error status an operation can answer.
import { z } from "zod";
import { PageContext, PageLink } from "../schemas/common";
import { WebhookTopic } from "../schemas/topics";
import { WebhookDisabledMessage, WebhookPage, WebhookView, WebhookWithSecret } from "../schemas/webhooks";
import { Delivery, DeliveryWithAttempts, OrderStatusMessage, RecoverResult } from "../schemas/deliveries";
import { WebhookStats } from "../schemas/delivery-stats";
import { UserDetails } from "../schemas/users";
import { PublishedEvents } from "../schemas/events";
import { type JsonSchema, openForAdditions, SCHEMA_REF, withoutMetaKeys } from "./json-schema";

// Response shapes that only the document needs: their TypeScript twins are interfaces in other modules.

/** RFC 9457 problem details, as lib/errors.ts builds them. */
const Problem = z.object({
	type: z.string().describe("A stable URN naming the kind of problem, e.g. urn:problem:validation-error"),
	title: z.string(),
	status: z.number().int(),
	detail: z.string().describe("What went wrong, in words meant for the developer"),
	errors: z
		.array(z.object({ path: z.string().describe("Where, e.g. events[0]; empty for the whole body"), message: z.string() }))
		.optional()
		.describe("422 only: one entry per problem found, at most 50"),
	errors_omitted: z.number().int().optional().describe("How many problems were found beyond the 50 listed"),
});

const WebhookTestResult = WebhookView.extend({
	success: z.boolean().describe("True only when the URL answered 200"),
	status_code: z.number().int().nullable().describe("The status the URL answered, null when it did not answer"),
	title: z.enum(["HTTP Status Error", "Timeout", "Unreachable", "Blocked"]).nullable(),
	detail: z.string().describe("A short reason in the service's words; the receiver's body is never echoed"),
});

const DeliveryPage = z.object({ deliveries: z.array(Delivery), context: PageContext, links: z.array(PageLink) });

/** Named response schemas, published under components.schemas. */
const COMPONENTS: Record<string, z.ZodType> = {
	Problem,
	EventTopic: WebhookTopic,
	Webhook: WebhookView,
	WebhookWithSecret,
	WebhookPage,
	WebhookTestResult,
	Delivery,
	DeliveryPage,
	DeliveryWithAttempts,
	WebhookStats,
	RecoverResult,
	UserDetails,
	OrderStatusMessage,
	WebhookDisabledMessage,
	PublishedEvents,
};

/** The error statuses an operation may list; each has a shared problem response. */
export type ErrorStatus = 400 | 401 | 403 | 404 | 409 | 412 | 413 | 415 | 422 | 429 | 503;

const ERROR_DESCRIPTIONS: Record<ErrorStatus, string> = {
	400: "The body is not valid JSON",
	401: "Token missing, malformed, badly signed, expired, or from the wrong issuer or audience",
	403: "The token lacks the scope this operation needs (events:publish)",
	404: "Unknown id, or an id that belongs to another customer",
	409: "Another webhook of this customer already has this name or URL",
	412: "If-Match does not match the current ETag: read again, then retry",
	413: "The body is over 64 KiB",
	415: "The body was not sent as application/json",
	422: "The body or parameters failed validation: `errors` says what and where",
	429: "Rate limit hit (per principal, or per client address before authentication): wait for Retry-After seconds",
	503: "A dependency (database, broker) is down; nothing is half-written, and the detail says whether a change may have been applied",
};

export function componentSchemas(): Record<string, JsonSchema> {
	const registry = z.registry<{ id: string }>();
	for (const [id, schema] of Object.entries(COMPONENTS)) registry.add(schema, { id });
	const { schemas } = z.toJSONSchema(registry, { io: "output", unrepresentable: "any", uri: SCHEMA_REF });
	return Object.fromEntries(Object.entries(schemas).map(([id, schema]) => [id, openForAdditions(withoutMetaKeys(schema as JsonSchema)) as JsonSchema]));
}

/** One response per error status, `Problem<status>`, that operations refer to instead of repeating it. */
export function problemResponses(): Record<string, JsonSchema> {
	return Object.fromEntries(
		Object.entries(ERROR_DESCRIPTIONS).map(([status, description]) => [
			`Problem${status}`,
			{
				description,
				...(status === "401" ? { headers: { "WWW-Authenticate": { schema: { type: "string" }, description: "Bearer" } } } : {}),
				...(status === "429" || status === "503" ? { headers: { "Retry-After": { schema: { type: "integer" }, description: "Seconds to wait" } } } : {}),
				content: { "application/problem+json": { schema: { $ref: SCHEMA_REF("Problem") } } },
			},
		]),
	);
}
