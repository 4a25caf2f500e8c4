// The OpenAPI document: served without a token, structurally valid 3.1, in step with the
// gateway's routes, and describing what the running services really answer (real responses
// are checked against the documented schemas).
import type { ServiceSchema } from "moleculer";
import { z } from "zod";
import ApiService from "../services/api.service";
import { buildOpenApiDocument, OPERATIONS } from "../lib/openapi";
import { startStack, type Stack, type TestResponse } from "./helpers/stack";
import { testDatabases } from "./helpers/services";
import packageJson from "../package.json";

type Json = Record<string, any>;

const METHODS = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

/** "GET /webhooks/:id" on route "/id/v3" -> ["get", "/id/v3/webhooks/{id}"]. */
function gatewayRoutes(): Array<{ method: string; path: string; action: string }> {
	const routes = (ApiService as ServiceSchema).settings!.routes as Array<{ path: string; aliases: Record<string, unknown> }>;
	return routes.flatMap(route =>
		Object.entries(route.aliases)
			.filter(([, target]) => typeof target === "string")
			.map(([alias, action]) => {
				const [method, aliasPath] = alias.split(" ");
				const path = (route.path + aliasPath).replace(/:(\w+)/g, "{$1}").replace(/\/$/, "");
				return { method: method.toLowerCase(), path, action: action as string };
			}),
	);
}

function operationsOf(document: Json): Array<{ method: string; path: string; operation: Json }> {
	return Object.entries(document.paths as Json).flatMap(([path, item]) =>
		Object.entries(item as Json)
			.filter(([method]) => METHODS.includes(method))
			.map(([method, operation]) => ({ method, path, operation: operation as Json })),
	);
}

function resolvePointer(document: Json, ref: string): unknown {
	if (!ref.startsWith("#/")) return undefined;
	return ref
		.slice(2)
		.split("/")
		.reduce<unknown>((node, key) => (node && typeof node === "object" ? (node as Json)[key.replace(/~1/g, "/").replace(/~0/g, "~")] : undefined), document);
}

function collectRefs(node: unknown, found: string[] = []): string[] {
	if (Array.isArray(node)) node.forEach(child => collectRefs(child, found));
	else if (node && typeof node === "object") {
		for (const [key, child] of Object.entries(node)) {
			if (key === "$ref" && typeof child === "string") found.push(child);
			else collectRefs(child, found);
		}
	}
	return found;
}

describe("OpenAPI document (structure)", () => {
	const document = buildOpenApiDocument({ version: "0.0.0-test" });
	const operations = operationsOf(document);

	it("is an OpenAPI 3.1 document with info, servers, paths and a bearer security scheme", () => {
		expect(document.openapi).toMatch(/^3\.1\.\d+$/);
		expect(document.info).toMatchObject({ title: expect.any(String), version: "0.0.0-test" });
		expect(Array.isArray(document.servers)).toBe(true);
		expect(document.security).toEqual([{ bearerAuth: [] }]);
		expect((document.components as Json).securitySchemes).toEqual({ bearerAuth: { type: "http", scheme: "bearer", bearerFormat: "JWT" } });
		for (const path of Object.keys(document.paths as Json)) expect(path).toMatch(/^\//);
	});

	it("describes a webhook's ordering and a delivery's waiting_for in every answer", () => {
		const schemas = (document.components as Json).schemas;
		expect(schemas.Webhook.properties.ordering).toMatchObject({ type: "string", enum: ["per_order", "none"] });
		expect(schemas.Webhook.required).toContain("ordering");
		expect(schemas.Delivery.properties.waiting_for).toMatchObject({ type: ["string", "null"], description: expect.stringContaining("earlier delivery of the same order") });
		expect(schemas.Delivery.required).toContain("waiting_for");
	});

	it("describes a webhook's rate_limit in every answer: a whole number from 1 to 10000, or null", () => {
		const schemas = (document.components as Json).schemas;
		expect(schemas.Webhook.properties.rate_limit).toMatchObject({
			anyOf: [{ type: "integer", minimum: 1, maximum: 10_000 }, { type: "null" }],
			description: expect.stringContaining("deliveries per second"),
		});
		expect(schemas.Webhook.required).toContain("rate_limit");
	});

	it("describes what the service sends for the operational topic webhook:disabled (OpenAPI webhooks)", () => {
		const disabled = (document.webhooks as Json)["webhook:disabled"].post;
		expect(disabled.requestBody.content["application/json"].schema).toEqual({ $ref: "#/components/schemas/WebhookDisabledMessage" });
		const schema = (document.components as Json).schemas.WebhookDisabledMessage;
		expect(schema.properties.data.properties.reason.enum).toEqual(["user", "gone", "failing"]);
	});

	it("gives every operation a unique operationId, a 2xx response and matching path parameters", () => {
		const ids = operations.map(({ operation }) => operation.operationId);
		expect(new Set(ids).size).toBe(ids.length);
		for (const { path, operation } of operations) {
			expect(Object.keys(operation.responses).some(status => /^2\d\d$/.test(status))).toBe(true);
			const placeholders = [...path.matchAll(/\{(\w+)\}/g)].map(match => match[1]).sort();
			const declared = (operation.parameters ?? []).filter((parameter: Json) => parameter.in === "path");
			expect(declared.map((parameter: Json) => parameter.name).sort()).toEqual(placeholders);
			for (const parameter of declared) expect(parameter.required).toBe(true);
			for (const parameter of operation.parameters ?? []) expect(["path", "query", "header"]).toContain(parameter.in);
		}
	});

	it("resolves every $ref inside the document", () => {
		const refs = collectRefs(document);
		expect(refs.length).toBeGreaterThan(20);
		for (const ref of new Set(refs)) expect({ ref, resolved: resolvePointer(document, ref) !== undefined }).toEqual({ ref, resolved: true });
	});

	it("documents problem+json errors: 401 on every authenticated operation, 422 wherever there is input", () => {
		const responses = (document.components as Json).responses as Json;
		for (const [name, response] of Object.entries(responses)) {
			expect({ name, content: Object.keys(response.content) }).toEqual({ name, content: ["application/problem+json"] });
		}
		for (const { path, method, operation } of operations) {
			const authenticated = operation.security === undefined;
			expect({ path, method, authenticated }).toEqual({ path, method, authenticated: path.startsWith("/id/v3/") });
			if (authenticated) expect(operation.responses["401"]).toEqual({ $ref: "#/components/responses/Problem401" });
			if (operation.requestBody || (operation.parameters ?? []).length) expect(operation.responses["422"]).toBeDefined();
		}
		expect(responses.Problem401.headers).toHaveProperty("WWW-Authenticate");
		expect(responses.Problem429.headers).toHaveProperty("Retry-After");
	});

	it("lists every action route of the gateway, and nothing the gateway does not route", () => {
		const routed = gatewayRoutes();
		expect(routed.length).toBeGreaterThanOrEqual(15);
		const documented = operations.map(({ method, path, operation }) => ({ method, path, action: operation["x-moleculer-action"] }));
		expect(documented).toEqual(expect.arrayContaining(routed));
		expect(routed).toEqual(expect.arrayContaining(documented));
	});

	it("describes request bodies from the validation schemas: strict, with their required fields", () => {
		const create = (document.paths as Json)["/id/v3/webhooks"].post.requestBody.content["application/json"].schema;
		expect(create).toMatchObject({ type: "object", additionalProperties: false, required: ["name", "url"] });
		expect(Object.keys(create.properties).sort()).toEqual(["event_types", "events", "headers", "name", "ordering", "rate_limit", "url"]);
		expect(create.properties.headers).toMatchObject({ type: "object", description: expect.stringContaining("Write-only") });
		expect(create.properties.ordering).toMatchObject({ type: "string", enum: ["per_order", "none"], default: "per_order", description: expect.stringContaining("one at a time") });
		expect(create.properties.rate_limit).toMatchObject({
			anyOf: [{ type: "integer", minimum: 1, maximum: 10_000 }, { type: "null" }],
			default: null,
			description: expect.stringMatching(/deliveries per second.*never fail/),
		});
		const patch = (document.paths as Json)["/id/v3/webhooks/{id}"].patch.requestBody.content["application/json"].schema;
		expect(Object.keys(patch.properties).sort()).toEqual(["active", "event_types", "events", "headers", "name", "ordering", "rate_limit"]);
		// PATCH leaves ordering as it is when it is not sent: no default there.
		expect(patch.properties.ordering).toEqual({ type: "string", enum: ["per_order", "none"], description: create.properties.ordering.description });
		// Nor for rate_limit, where null (not absence) removes the limit.
		expect(patch.properties.rate_limit).toEqual({
			anyOf: [{ type: "integer", minimum: 1, maximum: 10_000 }, { type: "null" }],
			description: expect.stringContaining("null removes the limit"),
		});
		const list = (document.paths as Json)["/id/v3/webhooks"].get.parameters;
		expect(list).toEqual(
			expect.arrayContaining([expect.objectContaining({ name: "per_page", in: "query", schema: expect.objectContaining({ minimum: 1, maximum: 100, default: 25 }) })]),
		);
		const unsubscribe = (document.paths as Json)["/email/unsubscribe"].post.requestBody.content;
		expect(Object.keys(unsubscribe)).toEqual(["application/x-www-form-urlencoded"]);
		// RFC 8058 one-click posts only List-Unsubscribe=One-Click, the token staying in the link's
		// query string: neither place may require it alone.
		const form = unsubscribe["application/x-www-form-urlencoded"].schema;
		expect(form.required ?? []).not.toContain("token");
		expect(Object.keys(form.properties).sort()).toEqual(["List-Unsubscribe", "token"]);
		const linkToken = (document.paths as Json)["/email/unsubscribe"].post.parameters.find((parameter: Json) => parameter.name === "token");
		expect(linkToken).toMatchObject({ in: "query", required: false });
	});

	it("has one operation per entry of OPERATIONS", () => {
		expect(operations).toHaveLength(OPERATIONS.length);
	});
});

describe.each(testDatabases())("OpenAPI document against the running services (%s)", database => {
	let stack: Stack;
	let document: Json;
	let token: string;

	/** Checks a real response body against the schema the document gives for it. */
	function expectDocumented(response: TestResponse, path: string, method: string): void {
		const operation = (document.paths as Json)[path][method];
		let described = operation.responses[String(response.status)];
		expect({ path, method, status: response.status, documented: Boolean(described) }).toEqual({ path, method, status: response.status, documented: true });
		if (described.$ref) described = resolvePointer(document, described.$ref);
		const mediaType = Object.keys(described.content ?? {})[0];
		if (!mediaType) {
			expect(response.text).toBe("");
			return;
		}
		expect(response.headers.get("content-type")).toContain(mediaType);
		const schema = JSON.parse(JSON.stringify({ ...described.content[mediaType].schema, $defs: (document.components as Json).schemas }).replaceAll("#/components/schemas/", "#/$defs/"));
		const result = z.fromJSONSchema(schema).safeParse(response.body);
		expect({ path, method, status: response.status, issues: result.success ? [] : result.error.issues }).toEqual({ path, method, status: response.status, issues: [] });
	}

	beforeAll(async () => {
		stack = await startStack({ database });
		token = await stack.token("openapi-user", { email: "openapi@example.com", name: "Open API" });
		const served = await stack.request("GET", "/openapi.json");
		expect(served.status).toBe(200);
		document = served.body;
	});
	afterAll(() => stack.stop());

	it("serves the document without a token, as JSON", async () => {
		const served = await stack.request("GET", "/openapi.json");
		expect(served.status).toBe(200);
		expect(served.headers.get("content-type")).toMatch(/^application\/json/);
		expect(served.body).toEqual(buildOpenApiDocument({ version: packageJson.version }));
	});

	it("describes the webhook endpoints' real answers", async () => {
		expectDocumented(await stack.request("GET", "/id/v3/webhooks/events", { token }), "/id/v3/webhooks/events", "get");

		const created = await stack.request("POST", "/id/v3/webhooks", {
			token,
			body: { name: "Documented", url: "https://hooks.example.invalid/documented", events: ["tasking:order_status"] },
		});
		expect(created.status).toBe(201);
		expectDocumented(created, "/id/v3/webhooks", "post");
		const id = created.body.id as string;
		const byId = "/id/v3/webhooks/{id}";

		expectDocumented(await stack.request("GET", "/id/v3/webhooks?per_page=1", { token }), "/id/v3/webhooks", "get");
		expectDocumented(await stack.request("GET", `/id/v3/webhooks/${id}`, { token }), byId, "get");
		expectDocumented(await stack.request("PATCH", `/id/v3/webhooks/${id}`, { token, body: { active: false } }), byId, "patch");
		expectDocumented(await stack.request("POST", `/id/v3/webhooks/${id}/rotate`, { token }), `${byId}/rotate`, "post");
		expectDocumented(await stack.request("POST", `/id/v3/webhooks/${id}/test`, { token }), `${byId}/test`, "post");
		expectDocumented(await stack.request("GET", `/id/v3/webhooks/${id}/deliveries`, { token }), `${byId}/deliveries`, "get");
		const recovered = await stack.request("POST", `/id/v3/webhooks/${id}/recover`, { token, body: { since: "2000-01-01T00:00:00Z" } });
		expect(recovered.status).toBe(202);
		expectDocumented(recovered, `${byId}/recover`, "post");
		expectDocumented(await stack.request("DELETE", `/id/v3/webhooks/${id}`, { token }), byId, "delete");
	});

	it("describes the documented errors as they are really answered", async () => {
		expectDocumented(await stack.request("GET", "/id/v3/webhooks"), "/id/v3/webhooks", "get");
		expectDocumented(await stack.request("POST", "/id/v3/webhooks", { token, body: { name: "", url: "http://x" } }), "/id/v3/webhooks", "post");
		expectDocumented(await stack.request("GET", "/id/v3/webhooks/00000000-0000-4000-8000-000000000000", { token }), "/id/v3/webhooks/{id}", "get");
		expectDocumented(await stack.request("POST", "/id/v3/webhooks", { token, body: "{not json", headers: { "content-type": "application/json" } }), "/id/v3/webhooks", "post");
	});

	it("describes the event intake's real answers: 202, 403 and 422", async () => {
		const path = "/id/v3/events/tasking.order_status";
		const producer = await stack.token("openapi-producer", { scope: "events:publish" });
		const event = { customer_id: "openapi-co", user_id: "openapi-user", order_id: "o-doc", status: "staged" };
		const accepted = await stack.request("POST", path, { token: producer, body: [event, { ...event, order_id: "o-doc-2" }] });
		expect(accepted.status).toBe(202);
		expectDocumented(accepted, path, "post");
		expectDocumented(await stack.request("POST", path, { token, body: event }), path, "post");
		expectDocumented(await stack.request("POST", path, { token: producer, body: [{ ...event, status: "lost" }] }), path, "post");
	});

	it("describes the user endpoints' real answers", async () => {
		expectDocumented(await stack.request("GET", "/id/v3/user/details", { token }), "/id/v3/user/details", "get");
		const body = { notifications: [{ category: "tasking", settings: [{ topic: "tasking:order_status", email: true }] }] };
		expectDocumented(await stack.request("PUT", "/id/v3/user/settings", { token, body }), "/id/v3/user/settings", "put");
	});
});
