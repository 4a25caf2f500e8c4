// The OpenAPI 3.1 description of the HTTP API, generated from the same zod schemas that validate
// requests (lib/schemas/*), so that the document cannot drift from what the services accept.
// The gateway serves it at GET /openapi.json.
//
// Each operation names the schema of its action's params: moleculer-web merges path, query and
// body into one object, so the generator splits it again: path placeholders become path
// parameters, the rest become query parameters (GET, DELETE) or the JSON body (POST, PUT, PATCH).
import { z } from "zod";
import { PageContext, PageLink, QUERY_INTEGERS } from "./schemas/common";
import { WebhookTopic } from "./schemas/topics";
import { CreateWebhook, ListWebhooks, UpdateWebhook, WebhookDisabledMessage, WebhookIdParams, WebhookPage, WebhookView, WebhookWithSecret } from "./schemas/webhooks";
import { Delivery, DeliveryParams, DeliveryWithAttempts, ListDeliveriesParams, MAX_RECOVER_BATCH, RecoverParams, RecoverResult, TestWebhookParams } from "./schemas/deliveries";
import { WebhookStats, WebhookStatsParams } from "./schemas/delivery-stats";
import { DetailsParams, NotificationsUpdate, UserDetails } from "./schemas/users";
import { MAX_UNSUBSCRIBE_TOKEN_LENGTH } from "./unsubscribe-token";
import packageJson from "../package.json";

type JsonSchema = Record<string, unknown>;
type HttpMethod = "get" | "post" | "put" | "patch" | "delete";

const API_BASE = "/id/v3";
const SCHEMA_REF = (name: string) => `#/components/schemas/${name}`;

// Shapes that only the document needs: their TypeScript twins are interfaces in other modules.

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

const UpdateSettings = z.object({ notifications: NotificationsUpdate }).strict();

const UnsubscribeQuery = z.object({ token: z.string().max(MAX_UNSUBSCRIBE_TOKEN_LENGTH).describe("The signed token from the email's link") });
const UnsubscribeForm = z.object({
	token: z.string().min(1).max(MAX_UNSUBSCRIBE_TOKEN_LENGTH),
	"List-Unsubscribe": z.literal("One-Click").optional().describe("Sent by mail clients doing RFC 8058 one-click unsubscribe"),
});

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
	WebhookDisabledMessage,
};

type ErrorStatus = 400 | 401 | 404 | 409 | 412 | 413 | 415 | 422 | 429 | 503;

interface Operation {
	method: HttpMethod;
	/** OpenAPI form: /id/v3/webhooks/{id}. */
	path: string;
	/** The Moleculer action behind the route (documented as x-moleculer-action). */
	action: string;
	summary: string;
	description?: string;
	tag: "Webhooks" | "Deliveries" | "Users" | "Email";
	/** The action's params schema: path, query and body fields together. */
	params?: z.ZodType;
	/** Fields of `params` left out of the documented body (accepted only to be refused). */
	hiddenFields?: string[];
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
		description: "Besides the business topics, the operational topic `webhook:disabled` tells a customer that one of their webhooks was disabled (see `webhooks` in this document).",
		success: { status: 200, description: "The topics", schema: { arrayOf: "EventTopic" } },
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
		public: true,
		query: UnsubscribeQuery,
		formBody: UnsubscribeForm,
		success: { status: 200, description: "An HTML page confirming the change", html: true },
		errors: [413, 422, 429],
	},
];

const ERROR_DESCRIPTIONS: Record<ErrorStatus, string> = {
	400: "The body is not valid JSON",
	401: "Token missing, malformed, badly signed, expired, or from the wrong issuer or audience",
	404: "Unknown id, or an id that belongs to another customer",
	409: "Another webhook of this customer already has this name or URL",
	412: "If-Match does not match the current ETag: read again, then retry",
	413: "The body is over 64 KiB",
	415: "The body was not sent as application/json",
	422: "The body or parameters failed validation: `errors` says what and where",
	429: "Rate limit hit (per principal, or per client address before authentication): wait for Retry-After seconds",
	503: "A dependency (database, broker) is down; nothing is half-written, and the detail says whether a change may have been applied",
};

function withoutMetaKeys(schema: JsonSchema): JsonSchema {
	const { $schema: _schema, $id: _id, ...rest } = schema;
	return rest;
}

/** Responses tolerate additions: a client should ignore fields it does not know. */
function openForAdditions(value: unknown): unknown {
	if (Array.isArray(value)) return value.map(openForAdditions);
	if (!value || typeof value !== "object") return value;
	const entries = Object.entries(value).filter(([key, child]) => !(key === "additionalProperties" && child === false));
	return Object.fromEntries(entries.map(([key, child]) => [key, openForAdditions(child)]));
}

function componentSchemas(): Record<string, JsonSchema> {
	const registry = z.registry<{ id: string }>();
	for (const [id, schema] of Object.entries(COMPONENTS)) registry.add(schema, { id });
	const { schemas } = z.toJSONSchema(registry, { io: "output", unrepresentable: "any", uri: SCHEMA_REF });
	return Object.fromEntries(Object.entries(schemas).map(([id, schema]) => [id, openForAdditions(withoutMetaKeys(schema as JsonSchema)) as JsonSchema]));
}

function inputSchema(schema: z.ZodType): { properties: Record<string, JsonSchema>; required: string[]; rest: JsonSchema } {
	// Query integers are documented as the integers they stand for, with their default.
	const override = ({ zodSchema, jsonSchema }: { zodSchema: unknown; jsonSchema: JsonSchema }) => {
		const def = (zodSchema as { _zod: { def: { type: string; innerType?: z.ZodType; defaultValue?: unknown } } })._zod.def;
		const documented = QUERY_INTEGERS.get((def.type === "default" ? def.innerType : zodSchema) as z.ZodType);
		if (!documented) return;
		delete jsonSchema.anyOf;
		Object.assign(jsonSchema, documented, def.type === "default" ? { default: def.defaultValue } : {});
	};
	const json = withoutMetaKeys(z.toJSONSchema(schema, { io: "input", unrepresentable: "any", override }) as JsonSchema);
	const { properties = {}, required = [], ...rest } = json as { properties?: Record<string, JsonSchema>; required?: string[] };
	return { properties, required, rest };
}

function responseSchema(schema: Operation["success"]["schema"]): JsonSchema | undefined {
	if (!schema) return undefined;
	if (typeof schema === "string") return { $ref: SCHEMA_REF(schema) };
	return { type: "array", items: { $ref: SCHEMA_REF(schema.arrayOf) } };
}

const hasBody = (operation: Operation) => ["post", "put", "patch"].includes(operation.method);
const pathNamesOf = (operation: Operation) => [...operation.path.matchAll(/\{(\w+)\}/g)].map(match => match[1]);
const inputOf = (schema: z.ZodType | undefined) => (schema ? inputSchema(schema) : { properties: {}, required: [], rest: {} });

/**
 * Where the query parameters of an operation are declared: the action's params minus the path
 * for an operation without a body, or a separate schema next to a body.
 */
function queryInput(operation: Operation): { properties: Record<string, JsonSchema>; required: string[] } {
	if (hasBody(operation)) return inputOf(operation.query);
	const input = inputOf(operation.params);
	const pathNames = pathNamesOf(operation);
	const names = Object.keys(input.properties).filter(name => !pathNames.includes(name) && !operation.hiddenFields?.includes(name));
	return { properties: Object.fromEntries(names.map(name => [name, input.properties[name]])), required: input.required };
}

/** The documented query parameters of each action reached over HTTP: the gateway refuses any other. */
export function queryParametersByAction(): Map<string, string[]> {
	return new Map(OPERATIONS.map(operation => [operation.action, Object.keys(queryInput(operation).properties)]));
}

function buildOperation(operation: Operation): JsonSchema {
	const pathNames = pathNamesOf(operation);
	const input = inputOf(operation.params);
	const parameters: JsonSchema[] = pathNames.map(name => ({
		name,
		in: "path",
		required: true,
		schema: input.properties[name] ?? { type: "string" },
	}));
	const bodyFields = Object.keys(input.properties).filter(name => !pathNames.includes(name) && !operation.hiddenFields?.includes(name));
	const hasJsonBody = hasBody(operation);
	const query = queryInput(operation);
	for (const [name, property] of Object.entries(query.properties)) {
		const { description, ...schema } = property;
		parameters.push({ name, in: "query", required: query.required.includes(name), schema, ...(description ? { description } : {}) });
	}
	if (operation.ifMatch) {
		parameters.push({ name: "If-Match", in: "header", required: false, schema: { type: "string" }, description: "The ETag last read: the update is refused with 412 if the record changed since" });
	}

	let requestBody: JsonSchema | undefined;
	if (operation.formBody) {
		requestBody = { required: true, content: { "application/x-www-form-urlencoded": { schema: withoutMetaKeys(z.toJSONSchema(operation.formBody, { io: "input" }) as JsonSchema) } } };
	} else if (hasJsonBody && bodyFields.length > 0) {
		const required = input.required.filter(name => bodyFields.includes(name));
		const schema = {
			...input.rest,
			properties: Object.fromEntries(bodyFields.map(name => [name, input.properties[name]])),
			...(required.length ? { required } : {}),
		};
		requestBody = { required: true, content: { "application/json": { schema } } };
	}

	const { success } = operation;
	const successSchema = responseSchema(success.schema);
	const responses: Record<string, JsonSchema> = {
		[String(success.status)]: {
			description: success.description,
			...(success.headers ? { headers: Object.fromEntries(Object.entries(success.headers).map(([name, description]) => [name, { description, schema: { type: "string" } }])) } : {}),
			...(success.html ? { content: { "text/html": { schema: { type: "string" } } } } : {}),
			...(successSchema ? { content: { "application/json": { schema: successSchema } } } : {}),
		},
	};
	for (const status of [...new Set(operation.errors)].sort()) responses[String(status)] = { $ref: `#/components/responses/Problem${status}` };
	for (const [status, description] of Object.entries(operation.htmlErrors ?? {})) {
		responses[status] = { description, content: { "text/html": { schema: { type: "string" } } } };
	}

	return {
		operationId: operation.action.replace(".", "_"),
		summary: operation.summary,
		...(operation.description ? { description: operation.description } : {}),
		tags: [operation.tag],
		"x-moleculer-action": operation.action,
		...(operation.public ? { security: [] } : {}),
		...(parameters.length ? { parameters } : {}),
		...(requestBody ? { requestBody } : {}),
		responses,
	};
}

export interface OpenApiOptions {
	version: string;
	/** PUBLIC_BASE_URL when configured; otherwise the document is relative to where it is served. */
	serverUrl?: string;
}

/** Builds the whole document. Cheap enough to run once per gateway start. */
export function buildOpenApiDocument(options: OpenApiOptions): JsonSchema {
	const paths: Record<string, Record<string, JsonSchema>> = {};
	for (const operation of OPERATIONS) {
		paths[operation.path] ??= {};
		paths[operation.path][operation.method] = buildOperation(operation);
	}
	const problemResponses = Object.fromEntries(
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
	return {
		openapi: "3.1.0",
		info: {
			title: "Webhook and notification settings API",
			version: options.version,
			description:
				"Webhooks (Standard Webhooks signatures), their delivery log, and per-user email notification preferences. " +
				"Every /id/v3 operation needs `Authorization: Bearer <JWT>`. Errors are RFC 9457 problem details. " +
				"Body fields come from the JSON body only, and an operation accepts only the query parameters listed here (others get 422). " +
				"OPTIONS is answered by the gateway (CORS preflights for the configured origins), HEAD is GET without a body, " +
				"and a method a path does not take gets 405 with Allow.",
		},
		servers: [{ url: options.serverUrl ?? "/" }],
		security: [{ bearerAuth: [] }],
		tags: [
			{ name: "Webhooks", description: "Webhooks, their secrets and tests" },
			{ name: "Deliveries", description: "The delivery log of a webhook" },
			{ name: "Users", description: "The caller's user record and email preferences" },
			{ name: "Email", description: "Links in notification emails (no bearer token: the link's signed token)" },
		],
		paths,
		// What this service sends to customers' URLs (OpenAPI 3.1 webhooks), for the operational topic.
		webhooks: {
			"webhook:disabled": {
				post: {
					summary: "One of the customer's webhooks was disabled (reason user, gone or failing)",
					description: "Sent to each active webhook of the customer subscribed to `webhook:disabled`, signed and retried like every delivery (Standard Webhooks headers).",
					requestBody: { required: true, content: { "application/json": { schema: { $ref: SCHEMA_REF("WebhookDisabledMessage") } } } },
					responses: { "200": { description: "Delivered; any other answer is a failed attempt and is retried" } },
					security: [],
				},
			},
		},
		components: {
			securitySchemes: { bearerAuth: { type: "http", scheme: "bearer", bearerFormat: "JWT" } },
			schemas: componentSchemas(),
			responses: problemResponses,
		},
	};
}

const serialised = new Map<string, string>();

/** The document as the gateway serves it, built once per server URL. */
export function openApiJson(serverUrl?: string): string {
	const key = serverUrl ?? "";
	let json = serialised.get(key);
	if (!json) {
		json = JSON.stringify(buildOpenApiDocument({ version: packageJson.version, serverUrl }));
		serialised.set(key, json);
	}
	return json;
}
