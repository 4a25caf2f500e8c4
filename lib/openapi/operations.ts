// The route table of the HTTP API: one entry per operation, naming the Moleculer action behind it,
// the zod schema of that action's params, the success answer and the error statuses it can give.
// operation-object.ts turns each entry into an OpenAPI operation.
import { z } from "zod";
import { CreateWebhook, ListWebhooks, UpdateWebhook, WebhookIdParams } from "../schemas/webhooks";
import { DeliveryParams, ListDeliveriesParams, MAX_RECOVER_BATCH, RecoverParams, TestWebhookParams } from "../schemas/deliveries";
import { WebhookStatsParams } from "../schemas/delivery-stats";
import { DetailsParams, NotificationsUpdate } from "../schemas/users";
import { MAX_UNSUBSCRIBE_TOKEN_LENGTH } from "../unsubscribe-token";
import { MAX_EVENTS_PER_REQUEST, PublishOrderStatusBody } from "../schemas/events";
import type { ErrorStatus } from "./components";

type HttpMethod = "get" | "post" | "put" | "patch" | "delete";

const API_BASE = "/id/v3";

// Request shapes that only the document needs: the services validate these inputs elsewhere.

const UpdateSettings = z.object({ notifications: NotificationsUpdate }).strict();

const UnsubscribeQuery = z.object({ token: z.string().max(MAX_UNSUBSCRIBE_TOKEN_LENGTH).describe("The signed token from the email's link") });
// The token comes once: in the link's query string (RFC 8058 one-click, whose body is only
// List-Unsubscribe=One-Click) or in the confirmation page's form. Neither place requires it alone.
const UnsubscribeLinkQuery = UnsubscribeQuery.partial();
const UnsubscribeForm = z.object({
	token: z.string().min(1).max(MAX_UNSUBSCRIBE_TOKEN_LENGTH).optional().describe("The signed token, when the link's query string does not carry it"),
	"List-Unsubscribe": z.literal("One-Click").optional().describe("Sent by mail clients doing RFC 8058 one-click unsubscribe"),
});

export interface Operation {
	method: HttpMethod;
	/** OpenAPI form: /id/v3/webhooks/{id}. */
	path: string;
	/** The Moleculer action behind the route (documented as x-moleculer-action). */
	action: string;
	summary: string;
	description?: string;
	tag: "Webhooks" | "Deliveries" | "Users" | "Email" | "Events";
	/** The action's params schema: path, query and body fields together. */
	params?: z.ZodType;
	/** Fields of `params` left out of the documented body (accepted only to be refused). */
	hiddenFields?: string[];
	/** A JSON body that is not an object of fields (the event intake: one event or a list). */
	jsonBody?: z.ZodType;
	/** A non-JSON request body (the unsubscribe form). */
	formBody?: z.ZodType;
	/** Query parameters of an operation that also takes a body (the unsubscribe form's link token). */
	query?: z.ZodType;
	success: { status: number; description: string; schema?: string | { arrayOf: string }; html?: boolean; headers?: Record<string, string> };
	errors: ErrorStatus[];
	/** Error statuses answered with an HTML page instead of problem details (the unsubscribe page). */
	htmlErrors?: Record<number, string>;
	/** Operations without a bearer token (the email links). */
	public?: boolean;
	ifMatch?: boolean;
}

// Errors every authenticated operation can answer.
const COMMON: ErrorStatus[] = [401, 429, 503];
const WITH_ID: ErrorStatus[] = [...COMMON, 404, 422];
const WITH_BODY: ErrorStatus[] = [400, 413, 415, 422];

export const OPERATIONS: Operation[] = [
	{
		method: "get",
		path: `${API_BASE}/webhooks/events`,
		action: "topics.webhookTopics",
		tag: "Webhooks",
		summary: "List the event topics a webhook can subscribe to",
		description:
			"Besides the business topics, the operational topic `webhook:disabled` tells a customer that one of their webhooks was disabled (see `webhooks` in this document). " +
			"Each topic carries `schema`, the JSON Schema (draft 2020-12) of the `data` of its deliveries, from which a receiver can generate types or validate what it receives.",
		success: { status: 200, description: "The topics, each with the schema of its deliveries' data", schema: { arrayOf: "EventTopic" } },
		errors: COMMON,
	},
	{
		method: "get",
		path: `${API_BASE}/webhooks`,
		action: "webhooks.list",
		tag: "Webhooks",
		summary: "List the caller's webhooks, newest first",
		description: "Keyset pagination: follow the `next` link while it is present.",
		params: ListWebhooks,
		success: { status: 200, description: "One page of webhooks", schema: "WebhookPage" },
		errors: [...COMMON, 422],
	},
	{
		method: "post",
		path: `${API_BASE}/webhooks`,
		action: "webhooks.create",
		tag: "Webhooks",
		summary: "Create a webhook",
		description:
			"The URL must be absolute https:// (HTTP is not supported), without credentials, and must not point at a private or reserved address. " +
			"`event_types` is accepted in place of `events`. The answer is the only time the secret is shown.",
		params: CreateWebhook,
		success: { status: 201, description: "The webhook, with its signing secret", schema: "WebhookWithSecret", headers: { Location: "The webhook's URL" } },
		errors: [...COMMON, ...WITH_BODY, 409],
	},
	{
		method: "get",
		path: `${API_BASE}/webhooks/{id}`,
		action: "webhooks.get",
		tag: "Webhooks",
		summary: "Read a webhook",
		params: WebhookIdParams,
		success: { status: 200, description: "The webhook", schema: "Webhook" },
		errors: WITH_ID,
	},
	{
		method: "patch",
		path: `${API_BASE}/webhooks/{id}`,
		action: "webhooks.update",
		tag: "Webhooks",
		summary: "Rename a webhook, change its events, or enable/disable it",
		description: "Send any of `name`, `events` (or `event_types`), `active`. The URL cannot be changed: create a new webhook instead.",
		params: UpdateWebhook,
		hiddenFields: ["url"],
		success: { status: 200, description: "The updated webhook", schema: "Webhook" },
		errors: [...WITH_ID, ...WITH_BODY, 409],
	},
	{
		method: "delete",
		path: `${API_BASE}/webhooks/{id}`,
		action: "webhooks.remove",
		tag: "Webhooks",
		summary: "Delete a webhook and cancel its pending deliveries",
		params: WebhookIdParams,
		success: { status: 204, description: "Deleted" },
		errors: WITH_ID,
	},
	{
		method: "post",
		path: `${API_BASE}/webhooks/{id}/rotate`,
		action: "webhooks.rotate",
		tag: "Webhooks",
		summary: "Issue a new signing secret",
		description: "During the grace period (SECRET_ROTATION_GRACE) deliveries carry signatures with both the new and the old secret.",
		params: WebhookIdParams,
		success: { status: 200, description: "The webhook with its new secret", schema: "WebhookWithSecret" },
		errors: WITH_ID,
	},
	{
		method: "post",
		path: `${API_BASE}/webhooks/{id}/test`,
		action: "dispatcher.testWebhook",
		tag: "Webhooks",
		summary: "Send a signed webhook:test event to the URL now",
		description: "Waits at most 5 s, follows no redirect and is not retried. Works whether the webhook is active or not.",
		params: TestWebhookParams,
		success: { status: 200, description: "The webhook and the outcome of the test", schema: "WebhookTestResult" },
		errors: WITH_ID,
	},
	{
		method: "get",
		path: `${API_BASE}/webhooks/{id}/deliveries`,
		action: "dispatcher.listDeliveries",
		tag: "Deliveries",
		summary: "List a webhook's deliveries, newest first",
		params: ListDeliveriesParams,
		success: { status: 200, description: "One page of deliveries", schema: "DeliveryPage" },
		errors: WITH_ID,
	},
	{
		method: "get",
		path: `${API_BASE}/webhooks/{id}/deliveries/{delivery_id}`,
		action: "dispatcher.getDelivery",
		tag: "Deliveries",
		summary: "Read a delivery with its payload and attempts",
		params: DeliveryParams,
		success: { status: 200, description: "The delivery", schema: "DeliveryWithAttempts" },
		errors: WITH_ID,
	},
	{
		method: "post",
		path: `${API_BASE}/webhooks/{id}/deliveries/{delivery_id}/retry`,
		action: "dispatcher.retryDelivery",
		tag: "Deliveries",
		summary: "Schedule a fresh attempt of a delivery now",
		params: DeliveryParams,
		success: { status: 202, description: "The delivery, pending again", schema: "Delivery" },
		errors: WITH_ID,
	},
	{
		method: "post",
		path: `${API_BASE}/webhooks/{id}/recover`,
		action: "dispatcher.recover",
		tag: "Deliveries",
		summary: "Give every failed delivery of a time window a fresh attempt now",
		description: `For recovering after an outage: each failed delivery created in [since, until) gets one attempt now. At most ${MAX_RECOVER_BATCH} per call; \`remaining\` counts the rest. Repeating the call while those attempts are pending schedules nothing twice.`,
		params: RecoverParams,
		success: { status: 202, description: "How many deliveries were scheduled, and how many are left", schema: "RecoverResult" },
		errors: [...WITH_ID, ...WITH_BODY],
	},
	{
		method: "get",
		path: `${API_BASE}/webhooks/{id}/stats`,
		action: "dispatcher.webhookStats",
		tag: "Deliveries",
		summary: "A webhook's delivery health per hour",
		description:
			"One bucket per hour over the window (`24h`), oldest first: deliveries created in that hour counted by their current status, " +
			"and attempts made in that hour counted by outcome.",
		params: WebhookStatsParams,
		success: { status: 200, description: "Counts per hour", schema: "WebhookStats" },
		errors: WITH_ID,
	},
	{
		method: "get",
		path: `${API_BASE}/user/details`,
		action: "users.details",
		tag: "Users",
		summary: "Read the caller's user record and notification preferences",
		description: "Every topic that supports email is listed; `email` is false until the user turns it on.",
		params: DetailsParams,
		success: { status: 200, description: "The user", schema: "UserDetails", headers: { ETag: "Send it back in If-Match to update safely" } },
		errors: COMMON,
	},
	{
		method: "put",
		path: `${API_BASE}/user/settings`,
		action: "users.updateSettings",
		tag: "Users",
		summary: "Turn email notifications on or off, per topic",
		description: "Merges: only the topics sent change. An empty or null list changes nothing.",
		params: UpdateSettings,
		ifMatch: true,
		success: { status: 200, description: "The user, as GET /user/details answers", schema: "UserDetails", headers: { ETag: "The new version" } },
		errors: [...COMMON, ...WITH_BODY, 412],
	},
	{
		method: "post",
		path: `${API_BASE}/events/tasking.order_status`,
		action: "api.publishOrderStatus",
		tag: "Events",
		summary: "Report tasking order status changes, for producers outside the broker",
		description:
			`One event, or a list of at most ${MAX_EVENTS_PER_REQUEST}. Needs a token with the scope \`events:publish\` (the \`scope\` claim, space-separated); ` +
			"any other token gets 403. The answer comes once every event is stored durably (JetStream in a cluster, the database embedded); " +
			"from there on an event is delivered to the customer's webhooks and emailed as one sent to the channel. " +
			"An event without `event_id` gets one, returned in `event_ids`; the same `event_id` again is answered 202 and delivered once. " +
			"A list is checked whole: any invalid event (or an unknown `user_id` without `customer_id`) gets 422 naming its index, e.g. `[3].status`, and nothing is stored.",
		jsonBody: PublishOrderStatusBody,
		success: { status: 202, description: "Every event is stored durably", schema: "PublishedEvents" },
		errors: [...COMMON, ...WITH_BODY, 403],
	},
	{
		method: "get",
		path: "/email/unsubscribe",
		action: "notifier.unsubscribePage",
		tag: "Email",
		summary: "The page behind an email's unsubscribe link: asks for confirmation",
		public: true,
		params: UnsubscribeQuery,
		success: { status: 200, description: "An HTML page with a confirmation button", html: true },
		htmlErrors: { 422: "An HTML page explaining that the link is invalid or has expired" },
		errors: [429],
	},
	{
		method: "post",
		path: "/email/unsubscribe",
		action: "notifier.unsubscribe",
		tag: "Email",
		summary: "Turn off the email the link was for (RFC 8058 one-click)",
		description: "The signed token goes in the query string (the email's List-Unsubscribe link) or in the form body, exactly once; without it the answer is 422.",
		public: true,
		query: UnsubscribeLinkQuery,
		formBody: UnsubscribeForm,
		success: { status: 200, description: "An HTML page confirming the change", html: true },
		errors: [413, 422, 429],
	},
];
