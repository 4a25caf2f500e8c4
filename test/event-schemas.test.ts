// Event schemas in the catalogue: GET /webhooks/events gives each topic the JSON Schema of its
// deliveries' `data`, generated from the zod schema the dispatcher builds them with; real
// deliveries, received at a real HTTPS receiver, validate against what is published (Ajv, draft
// 2020-12 with formats); the SDK's verifyWebhook validates and types them on request. On SQLite
// and PostgreSQL.
import crypto from "node:crypto";
import Ajv2020 from "ajv/dist/2020";
import addFormats from "ajv-formats";
import { Webhook } from "standardwebhooks";
import { EVENT_DATA_SCHEMAS, WebhookPayloadError, WebhookVerificationError, verifyWebhook, type OrderStatusData } from "@satellite-webhooks/sdk";
import { testDatabases } from "./helpers/services";
import { newCustomer, orderEvent, startDeliveryStack, waitUntil, type CreatedWebhook, type DeliveryStack } from "./helpers/delivery-stack";
import type { ReceivedRequest } from "./helpers/https-receiver";
import { eventDataJsonSchema, UNDESCRIBED_DATA } from "../lib/schemas/event-payloads";

type Json = Record<string, any>;

/** A validator as a receiver would set one up from the published schemas. */
function receiverAjv(): Ajv2020 {
	const ajv = new Ajv2020({ allErrors: true, strict: true });
	addFormats(ajv);
	return ajv;
}

/** A body signed with `secret` now, as the dispatcher signs, for the SDK's checks on bodies no real sender would send. */
function signed(body: string, secret: string) {
	const now = new Date();
	const id = `msg_${crypto.randomUUID()}`;
	return { body, headers: { "webhook-id": id, "webhook-timestamp": String(Math.floor(now.getTime() / 1000)), "webhook-signature": new Webhook(secret).sign(id, now, body) } };
}

describe.each(testDatabases())("event schemas on %s", database => {
	let env: DeliveryStack;

	const publishedSchemas = async (token: string): Promise<Map<string, Json>> => {
		const response = await env.stack.request("GET", "/id/v3/webhooks/events", { token });
		expect(response.status).toBe(200);
		return new Map((response.body as Json[]).map(entry => [entry.topic, entry.schema]));
	};
	const firstDelivery = (webhook: CreatedWebhook): Promise<ReceivedRequest> =>
		waitUntil(() => env.received(webhook), requests => requests.length > 0, `a delivery to ${webhook.path}`).then(requests => requests[0]);

	beforeAll(async () => {
		env = await startDeliveryStack(database);
	});
	afterAll(() => env?.stop());

	it("gives every topic of GET /webhooks/events the JSON Schema of its data, generated from the zod schema, and a valid 2020-12 schema", async () => {
		const alice = await newCustomer(env.stack);
		const schemas = await publishedSchemas(alice.token);
		expect([...schemas.keys()]).toEqual(["tasking:order_status", "webhook:disabled"]);
		expect(schemas.get("tasking:order_status")).toEqual(eventDataJsonSchema("tasking:order_status"));
		expect(schemas.get("webhook:disabled")).toEqual(eventDataJsonSchema("webhook:disabled"));
		const ajv = receiverAjv();
		for (const [topic, schema] of schemas) {
			expect({ topic, dialect: schema.$schema }).toEqual({ topic, dialect: "https://json-schema.org/draft/2020-12/schema" });
			expect({ topic, valid: ajv.validateSchema(schema), errors: ajv.errors ?? null }).toEqual({ topic, valid: true, errors: null });
			// The SDK validates with exactly what the catalogue publishes.
			expect(EVENT_DATA_SCHEMAS[topic as keyof typeof EVENT_DATA_SCHEMAS]).toEqual(schema);
		}
		expect(schemas.get("tasking:order_status")).toMatchObject({ required: expect.arrayContaining(["order_id", "status", "user_id"]) });
	});

	it("a real tasking:order_status delivery validates against the published schema, and the SDK returns it validated and typed", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const event = orderEvent(alice, { status: "Fulfilled", previous_status: "in progress", order_name: "Harbour pass", details: { cloud_cover: 12, tiles: ["a", "b"] } });
		await env.stack.app.broker.call("dispatcher.publish", event);
		const delivery = await firstDelivery(webhook);

		const schema = (await publishedSchemas(alice.token)).get("tasking:order_status")!;
		const ajv = receiverAjv();
		const validate = ajv.compile(schema);
		const body = JSON.parse(delivery.body);
		expect(body.type).toBe("tasking:order_status");
		expect({ valid: validate(body.data), errors: validate.errors ?? null }).toEqual({ valid: true, errors: null });
		// The same validator refuses what breaks the contract, so the pass above means something.
		expect(validate({ ...body.data, status: "lost" })).toBe(false);
		const { order_id: _orderId, ...withoutOrder } = body.data;
		expect(validate(withoutOrder)).toBe(false);

		const verified = verifyWebhook(delivery.body, delivery.headers, webhook.secret, { validate: true, types: ["tasking:order_status"] });
		const data: OrderStatusData = verified.data;
		expect(data).toEqual({
			order_id: event.order_id,
			status: "fulfilled",
			previous_status: "in progress",
			user_id: alice.userId,
			order_name: "Harbour pass",
			cloud_cover: 12,
			tiles: ["a", "b"],
		});
		expect(() => verifyWebhook(delivery.body, delivery.headers, webhook.secret, { types: ["webhook:disabled"] })).toThrow(WebhookPayloadError);
	});

	it("a real webhook:disabled delivery validates against the published schema", async () => {
		const bob = await newCustomer(env.stack);
		const watched = await env.createWebhook(bob.token);
		const notices = await env.createWebhook(bob.token, { events: ["webhook:disabled"] });
		const patched = await env.stack.request("PATCH", `/id/v3/webhooks/${watched.id}`, { token: bob.token, body: { active: false } });
		expect(patched.status).toBe(200);
		const delivery = await firstDelivery(notices);

		const validate = receiverAjv().compile((await publishedSchemas(bob.token)).get("webhook:disabled")!);
		const body = JSON.parse(delivery.body);
		expect(body).toMatchObject({ type: "webhook:disabled", data: { webhook_id: watched.id, reason: "user" } });
		expect({ valid: validate(body.data), errors: validate.errors ?? null }).toEqual({ valid: true, errors: null });
		expect(validate({ ...body.data, webhook_id: "not-a-uuid" })).toBe(false);
		expect(verifyWebhook(delivery.body, delivery.headers, notices.secret, { validate: true }).type).toBe("webhook:disabled");
	});

	it("publishes the schema a registering service gives, a schema open to any data without one, and refuses a schema that is not an object", async () => {
		const carol = await newCustomer(env.stack);
		const captureSchema = {
			$schema: "https://json-schema.org/draft/2020-12/schema",
			type: "object",
			properties: { capture_id: { type: "string" } },
			required: ["capture_id"],
		};
		await env.stack.app.broker.call("topics.register", { topic: "imaging:capture_ready", category: "imaging", name: "Capture ready", description: "A capture is ready", schema: captureSchema });
		await env.stack.app.broker.call("topics.register", { topic: "imaging:capture_lost", category: "imaging", name: "Capture lost", description: "A capture was lost" });
		let schemas = await publishedSchemas(carol.token);
		expect(schemas.get("imaging:capture_ready")).toEqual(captureSchema);
		expect(schemas.get("imaging:capture_lost")).toEqual(UNDESCRIBED_DATA);
		expect(receiverAjv().validate(UNDESCRIBED_DATA, { anything: [1, "two"] })).toBe(true);

		for (const schema of ["not a schema", ["type", "object"], { description: "x".repeat(70 * 1024) }]) {
			await expect(
				env.stack.app.broker.call("topics.register", { topic: "imaging:capture_ready", category: "imaging", name: "Renamed", description: "Changed", schema }),
			).rejects.toMatchObject({ code: 422, data: expect.arrayContaining([expect.objectContaining({ path: "schema" })]) });
		}
		schemas = await publishedSchemas(carol.token);
		expect(schemas.get("imaging:capture_ready")).toEqual(captureSchema);
		const listed = (await env.stack.request("GET", "/id/v3/webhooks/events", { token: carol.token })).body as Json[];
		expect(listed.find(entry => entry.topic === "imaging:capture_ready")).toMatchObject({ name: "Capture ready", description: "A capture is ready" });
	});
});

describe("verifyWebhook with validation", () => {
	const secret = `whsec_${crypto.randomBytes(32).toString("base64")}`;
	const orderBody = (data: Json) => JSON.stringify({ type: "tasking:order_status", timestamp: new Date().toISOString(), data });
	const goodData = { order_id: "o-1", status: "failed", previous_status: null, user_id: "u-1", order_name: null };

	it("keeps the three-argument form as it was: no schema check", () => {
		const { body, headers } = signed(orderBody({ order_id: 7 }), secret);
		expect(verifyWebhook(body, headers, secret).data).toEqual({ order_id: 7 });
	});

	it("refuses a genuine body whose data breaks its type's schema, naming every problem, as a WebhookVerificationError", () => {
		const { body, headers } = signed(orderBody({ ...goodData, order_id: 7, status: "lost" }), secret);
		const error = (() => {
			try {
				verifyWebhook(body, headers, secret, { validate: true });
			} catch (err) {
				return err;
			}
		})() as WebhookPayloadError;
		expect(error).toBeInstanceOf(WebhookPayloadError);
		expect(error).toBeInstanceOf(WebhookVerificationError);
		expect(error.problems.map(problem => problem.path).sort()).toEqual(["/data/order_id", "/data/status"]);
	});

	it("refuses an unknown type when validating, and lets fields the schema does not name through", () => {
		const unknown = signed(JSON.stringify({ type: "imaging:capture_ready", timestamp: new Date().toISOString(), data: {} }), secret);
		expect(() => verifyWebhook(unknown.body, unknown.headers, secret, { validate: true })).toThrow(/Unknown event type imaging:capture_ready/);
		const extended = signed(orderBody({ ...goodData, added_later: true }), secret);
		expect(verifyWebhook(extended.body, extended.headers, secret, { validate: true }).data).toEqual({ ...goodData, added_later: true });
	});

	it("checks the signature before the schema: a forged body is a plain verification failure", () => {
		const { body, headers } = signed(orderBody(goodData), secret);
		const forged = body.replace('"failed"', '"fulfilled"');
		const error = (() => {
			try {
				verifyWebhook(forged, headers, secret, { validate: true });
			} catch (err) {
				return err;
			}
		})();
		expect(error).toBeInstanceOf(WebhookVerificationError);
		expect(error).not.toBeInstanceOf(WebhookPayloadError);
	});
});
