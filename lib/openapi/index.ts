// The OpenAPI 3.1 description of the HTTP API, generated from the same zod schemas that validate
// requests (lib/schemas/*), so that the document cannot drift from what the services accept.
// The gateway serves it at GET /openapi.json.
//
// This module assembles the document; the route table is in operations.ts, its translation into
// OpenAPI operations in operation-object.ts, and the shared schemas and responses in components.ts.
import { type JsonSchema, SCHEMA_REF } from "./json-schema";
import { componentSchemas, problemResponses } from "./components";
import { OPERATIONS } from "./operations";
import { buildOperation } from "./operation-object";
import packageJson from "../../package.json";

export { OPERATIONS } from "./operations";
export { queryParametersByAction } from "./operation-object";

export interface OpenApiOptions {
	version: string;
	/** PUBLIC_BASE_URL when configured; otherwise the document is relative to where it is served. */
	serverUrl?: string;
}

/** An OpenAPI 3.1 `webhooks` entry: what the service POSTs to subscribers of `topic`. */
function deliveredMessage(topic: string, summary: string, bodySchema: string): JsonSchema {
	return {
		post: {
			summary,
			description: `Sent to each active webhook of the customer subscribed to \`${topic}\`, signed and retried like every delivery (Standard Webhooks headers).`,
			requestBody: { required: true, content: { "application/json": { schema: { $ref: SCHEMA_REF(bodySchema) } } } },
			responses: { "200": { description: "Delivered; any other answer is a failed attempt and is retried" } },
			security: [],
		},
	};
}

/** Builds the whole document. Cheap enough to run once per gateway start. */
export function buildOpenApiDocument(options: OpenApiOptions): JsonSchema {
	const paths: Record<string, Record<string, JsonSchema>> = {};
	for (const operation of OPERATIONS) {
		paths[operation.path] ??= {};
		paths[operation.path][operation.method] = buildOperation(operation);
	}
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
			{ name: "Events", description: "Order status events from producers outside the broker (scope events:publish)" },
		],
		paths,
		// What this service sends to customers' URLs (OpenAPI 3.1 webhooks), one entry per topic.
		webhooks: {
			"tasking:order_status": deliveredMessage("tasking:order_status", "A tasking order of the customer changed status", "OrderStatusMessage"),
			"webhook:disabled": deliveredMessage("webhook:disabled", "One of the customer's webhooks was disabled (reason user, gone or failing)", "WebhookDisabledMessage"),
		},
		components: {
			securitySchemes: { bearerAuth: { type: "http", scheme: "bearer", bearerFormat: "JWT" } },
			schemas: componentSchemas(),
			responses: problemResponses(),
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
