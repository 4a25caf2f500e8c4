// The dispatcher's HTTP surface through the real gateway: the webhook test endpoint and the
// delivery log (list, detail, retry), with tenant isolation and input validation. On SQLite and
// PostgreSQL, against a real HTTPS receiver.
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import { expectProblem, startStack } from "./helpers/stack";
import { testDatabases } from "./helpers/services";
import { SHORT_RETRY_SCHEDULE, startDeliveryStack, verified, waitUntil, type CreatedWebhook, type DeliveryStack, type OrderEvent } from "./helpers/delivery-stack";

// A page token as the API makes them: base64url of [time, id].
const pageToken = (fields: unknown) => Buffer.from(JSON.stringify(fields)).toString("base64url");

describe.each(testDatabases())("dispatcher API on %s", database => {
	let env: DeliveryStack;

	const db = () => env.stack.db;
	const request = (method: string, path: string, token: string, body?: unknown) => env.stack.request(method, path, { token, body });
	const newCustomer = async () => {
		const id = `cust-${crypto.randomBytes(4).toString("hex")}`;
		return { id, userId: `user-${id}`, token: await env.stack.token(`user-${id}`, { customer: id }) };
	};
	const publish = (customer: { id: string; userId: string }) => {
		const event: OrderEvent = { event_id: crypto.randomUUID(), customer_id: customer.id, user_id: customer.userId, order_id: `order-${crypto.randomBytes(3).toString("hex")}`, status: "staged" };
		return env.stack.app.broker.call("dispatcher.publish", event).then(() => event);
	};
	const deliveryOf = (eventId: string, webhook: CreatedWebhook) => db()("deliveries").where({ event_id: eventId, webhook_id: webhook.id }).first();

	beforeAll(async () => {
		// The hand retries below start from a delivery that has run out of its retries.
		env = await startDeliveryStack(database, { env: { DELIVERY_RETRY_SCHEDULE: SHORT_RETRY_SCHEDULE } });
	});
	afterAll(() => env?.stop());

	describe("POST /webhooks/{id}/test", () => {
		it("sends a signed webhook:test event through the real sender and reports success", async () => {
			const alice = await newCustomer();
			const webhook = await env.createWebhook(alice.token, { name: "ERP" });
			const response = await request("POST", `/id/v3/webhooks/${webhook.id}/test`, alice.token);
			expect(response.status).toBe(200);
			expect(response.body).toMatchObject({ id: webhook.id, name: "ERP", url: webhook.url, events: ["tasking:order_status"], active: true, success: true, status_code: 200, title: null });
			expect(response.body).not.toHaveProperty("secret");
			const [received] = env.received(webhook);
			const payload = verified(received, webhook.secret);
			expect(payload).toMatchObject({ type: "webhook:test", timestamp: expect.any(String), data: { webhook_id: webhook.id } });
			// A test is not a delivery: nothing is persisted, nothing is retried.
			expect(await db()("deliveries").where({ webhook_id: webhook.id })).toHaveLength(0);
		});

		it("reports an HTTP status error with the code, never echoing the receiver's body", async () => {
			const alice = await newCustomer();
			const webhook = await env.createWebhook(alice.token);
			env.script(webhook, [{ status: 503, body: "internal-detail-do-not-leak" }], { status: 500 });
			const response = await request("POST", `/id/v3/webhooks/${webhook.id}/test/`, alice.token);
			expect(response.status).toBe(200);
			expect(response.body).toMatchObject({ success: false, status_code: 503, title: "HTTP Status Error", detail: expect.stringContaining("503") });
			expect(response.text).not.toContain("internal-detail-do-not-leak");
			expect(env.received(webhook)).toHaveLength(1);
		});

		it("times out after WEBHOOK_TEST_TIMEOUT (5 s), not the 15 s delivery timeout", async () => {
			const alice = await newCustomer();
			const webhook = await env.createWebhook(alice.token);
			env.script(webhook, [{ hang: true }]);
			const response = await request("POST", `/id/v3/webhooks/${webhook.id}/test`, alice.token);
			expect(response.status).toBe(200);
			expect(response.body).toMatchObject({ success: false, status_code: null, title: "Timeout", detail: "No response within 5 s" });
		});

		it("works while the webhook is disabled", async () => {
			const alice = await newCustomer();
			const webhook = await env.createWebhook(alice.token);
			await request("PATCH", `/id/v3/webhooks/${webhook.id}`, alice.token, { active: false });
			const response = await request("POST", `/id/v3/webhooks/${webhook.id}/test`, alice.token);
			expect(response.body).toMatchObject({ active: false, success: true, status_code: 200 });
		});

		it("answers 404 for another customer's webhook and 422 for a malformed id, sending nothing", async () => {
			const alice = await newCustomer();
			const mallory = await newCustomer();
			const webhook = await env.createWebhook(alice.token);
			expectProblem(await request("POST", `/id/v3/webhooks/${webhook.id}/test`, mallory.token), 404);
			expectProblem(await request("POST", `/id/v3/webhooks/${crypto.randomUUID()}/test`, alice.token), 404);
			expectProblem(await request("POST", "/id/v3/webhooks/not-a-uuid/test", alice.token), 422);
			expectProblem(await request("POST", `/id/v3/webhooks/${webhook.id}/test`, alice.token, { unexpected: true }), 422);
			expect(env.received(webhook)).toHaveLength(0);
		});
	});

	describe("delivery log", () => {
		it("lists a webhook's deliveries newest first, in pages, filtered by status", async () => {
			const alice = await newCustomer();
			const webhook = await env.createWebhook(alice.token);
			const events = [];
			for (let i = 0; i < 3; i++) events.push(await publish(alice));
			for (const event of events) await waitUntil(() => deliveryOf(event.event_id!, webhook), row => row?.status === "succeeded", "delivery");

			const first = await request("GET", `/id/v3/webhooks/${webhook.id}/deliveries?per_page=2`, alice.token);
			expect(first.status).toBe(200);
			expect(first.body.context).toEqual({ per_page: 2, matched: 3, returned: 2 });
			expect(first.body.links).toEqual([{ rel: "next", href: expect.stringMatching(/^\/id\/v3\/webhooks\/.+\/deliveries\?per_page=2&token=/), method: "GET" }]);
			const second = await request("GET", first.body.links[0].href, alice.token);
			expect(second.body.context).toEqual({ per_page: 2, matched: 3, returned: 1 });
			expect(second.body.links).toEqual([]);
			const listed = [...first.body.deliveries, ...second.body.deliveries];
			expect(listed.map(delivery => delivery.event_id)).toEqual(events.map(event => event.event_id).reverse());
			for (const delivery of listed) {
				expect(delivery).toEqual({
					id: expect.any(String),
					webhook_id: webhook.id,
					event_id: expect.any(String),
					message_id: `msg_${delivery.id}`,
					type: "tasking:order_status",
					status: "succeeded",
					attempt_count: 1,
					next_attempt_at: null,
					last_attempt_at: expect.any(String),
					last_status_code: 200,
					last_error_kind: null,
					waiting_for: null,
					created_at: expect.any(String),
					updated_at: expect.any(String),
				});
			}

			const succeeded = await request("GET", `/id/v3/webhooks/${webhook.id}/deliveries?status=succeeded&per_page=1`, alice.token);
			expect(succeeded.body.context.matched).toBe(3);
			expect(succeeded.body.links[0].href).toContain("status=succeeded");
			const failed = await request("GET", `/id/v3/webhooks/${webhook.id}/deliveries/?status=failed`, alice.token);
			expect(failed.body).toEqual({ deliveries: [], context: { per_page: 25, matched: 0, returned: 0 }, links: [] });
		});

		it("shows one delivery with its payload and attempts, never the receiver's response body", async () => {
			const alice = await newCustomer();
			const webhook = await env.createWebhook(alice.token);
			env.script(webhook, [{ status: 500, body: "stack trace from the receiver" }], { status: 200, body: "receiver-private-body" });
			const event = await publish(alice);
			const row = await waitUntil(() => deliveryOf(event.event_id!, webhook), found => found?.status === "succeeded", "delivery");
			const response = await request("GET", `/id/v3/webhooks/${webhook.id}/deliveries/${row.id}`, alice.token);
			expect(response.status).toBe(200);
			expect(response.body).toMatchObject({ id: row.id, status: "succeeded", attempt_count: 2, payload: { type: "tasking:order_status", data: { order_id: event.order_id } } });
			expect(response.body.attempts).toEqual([
				{ attempt: 1, attempted_at: expect.any(String), success: false, status_code: 500, error_kind: "http_status", title: "HTTP Status Error", detail: expect.any(String), duration_ms: expect.any(Number) },
				{ attempt: 2, attempted_at: expect.any(String), success: true, status_code: 200, error_kind: null, title: null, detail: "", duration_ms: expect.any(Number) },
			]);
			expect(response.text).not.toMatch(/stack trace from the receiver|receiver-private-body|response_excerpt/);
		});

		it("retries a failed delivery by hand: 202, one fresh attempt with the same webhook-id", async () => {
			const alice = await newCustomer();
			const webhook = await env.createWebhook(alice.token);
			env.script(webhook, [], { status: 503 });
			const event = await publish(alice);
			const failed = await waitUntil(() => deliveryOf(event.event_id!, webhook), row => row?.status === "failed", "the delivery to fail");
			expect(failed.attempt_count).toBe(6);

			env.script(webhook, [], { status: 200 });
			const response = await request("POST", `/id/v3/webhooks/${webhook.id}/deliveries/${failed.id}/retry`, alice.token);
			expect(response.status).toBe(202);
			expect(response.body).toMatchObject({ id: failed.id, status: "pending", attempt_count: 6 });
			const done = await waitUntil(() => deliveryOf(event.event_id!, webhook), row => row?.status === "succeeded", "the retried delivery");
			expect(done.attempt_count).toBe(7);
			const requests = env.received(webhook);
			expect(requests).toHaveLength(7);
			expect(new Set(requests.map(received => received.headers["webhook-id"]))).toEqual(new Set([`msg_${failed.id}`]));
			verified(requests[6], webhook.secret);
		});

		it("a hand retry that fails again leaves the delivery failed, without automatic retries", async () => {
			const alice = await newCustomer();
			const webhook = await env.createWebhook(alice.token);
			const event = await publish(alice);
			const done = await waitUntil(() => deliveryOf(event.event_id!, webhook), row => row?.status === "succeeded", "delivery");
			env.script(webhook, [], { status: 500 });
			expect((await request("POST", `/id/v3/webhooks/${webhook.id}/deliveries/${done.id}/retry`, alice.token)).status).toBe(202);
			const failed = await waitUntil(() => deliveryOf(event.event_id!, webhook), row => row?.status === "failed", "the hand retry to fail");
			expect(failed).toMatchObject({ attempt_count: 2, next_attempt_at: null, last_status_code: 500 });
			await sleep(1_500);
			expect(env.received(webhook)).toHaveLength(2);
		});

		it("keeps each customer's log to itself: 404 for others' webhooks and deliveries, 422 for malformed input, nothing changed", async () => {
			const alice = await newCustomer();
			const mallory = await newCustomer();
			const webhook = await env.createWebhook(alice.token);
			const otherOfAlice = await env.createWebhook(alice.token);
			const event = await publish(alice);
			const row = await waitUntil(() => deliveryOf(event.event_id!, webhook), found => found?.status === "succeeded", "delivery");
			const before = await db()("deliveries").where({ id: row.id }).first();

			for (const [method, path] of [
				["GET", `/id/v3/webhooks/${webhook.id}/deliveries`],
				["GET", `/id/v3/webhooks/${webhook.id}/deliveries/${row.id}`],
				["POST", `/id/v3/webhooks/${webhook.id}/deliveries/${row.id}/retry`],
			]) {
				expectProblem(await request(method, path, mallory.token), 404);
			}
			// Alice's own other webhook does not reach this delivery either.
			expectProblem(await request("GET", `/id/v3/webhooks/${otherOfAlice.id}/deliveries/${row.id}`, alice.token), 404);
			expectProblem(await request("POST", `/id/v3/webhooks/${otherOfAlice.id}/deliveries/${row.id}/retry`, alice.token), 404);
			expectProblem(await request("GET", `/id/v3/webhooks/${webhook.id}/deliveries/${crypto.randomUUID()}`, alice.token), 404);

			expectProblem(await request("GET", `/id/v3/webhooks/${webhook.id}/deliveries/not-a-uuid`, alice.token), 422);
			expectProblem(await request("GET", "/id/v3/webhooks/not-a-uuid/deliveries", alice.token), 422);
			expectProblem(await request("POST", `/id/v3/webhooks/${webhook.id}/deliveries/${row.id}x/retry`, alice.token), 422);
			for (const query of ["status=delivered", "per_page=0", "per_page=101", "per_page=abc", "token=%%%", "token=bm9wZQ", `token=${pageToken(["2026-11-28T00:00:00.000Z", "x' OR '1'='1"])}`, "unknown=1"]) {
				const response = await request("GET", `/id/v3/webhooks/${webhook.id}/deliveries?${query}`, alice.token);
				expectProblem(response, 422);
				expect(response.body.errors.length).toBeGreaterThan(0);
			}
			expect(await db()("deliveries").where({ id: row.id }).first()).toEqual(before);
			expect(env.received(webhook)).toHaveLength(1);
		});
	});
});

describe.each(testDatabases())("webhook test on %s when the address is no longer allowed", database => {
	it("reports Blocked and sends nothing", async () => {
		// Created while loopback was allowed; then the operator narrowed WEBHOOK_ALLOW_NETS.
		const before = await startDeliveryStack(database);
		const token = await before.stack.token("alice");
		const webhook = await before.createWebhook(token);
		await before.stack.stopServices();
		const after = await startStack({
			database,
			dataDir: before.stack.dataDir,
			schema: before.stack.schema,
			env: { WEBHOOK_ALLOW_NETS: "", WEBHOOK_CA_FILE: before.caFile },
		});
		try {
			const response = await after.request("POST", `/id/v3/webhooks/${webhook.id}/test`, { token });
			expect(response.status).toBe(200);
			expect(response.body).toMatchObject({ id: webhook.id, success: false, status_code: null, title: "Blocked" });
			expect(before.received(webhook)).toHaveLength(0);
		} finally {
			await after.stopServices();
			await after.db.destroy();
			await before.stop();
		}
	});
});
