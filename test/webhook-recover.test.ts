// POST /webhooks/{id}/recover through the real gateway, with a real HTTPS receiver: failed
// deliveries in the window get one fresh attempt, those outside it do not; the count, the bound
// per call, idempotence, isolation between customers and bad input. On SQLite and PostgreSQL.
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import { testDatabases } from "./helpers/services";
import { newCustomer, orderEvent, startDeliveryStack, waitUntil, type CreatedWebhook, type DeliveryStack } from "./helpers/delivery-stack";
import { expectProblem } from "./helpers/stack";
import { timeOrderedUuid } from "../lib/ids";
import { MAX_RECOVER_BATCH } from "../lib/schemas/deliveries";

describe.each(testDatabases())("recover on %s", database => {
	let env: DeliveryStack;

	const db = () => env.stack.db;
	const publishAll = async (customer: { id: string; userId: string }, count: number) => {
		const events = Array.from({ length: count }, () => orderEvent(customer));
		for (const event of events) await env.stack.app.broker.call("dispatcher.publish", event);
		return events.map(event => event.event_id!);
	};
	const statuses = async (webhook: CreatedWebhook, eventIds: string[]) =>
		(await db()("deliveries").where({ webhook_id: webhook.id }).whereIn("event_id", eventIds).select("status")).map(row => row.status as string);
	const allFailed = (webhook: CreatedWebhook, eventIds: string[]) =>
		waitUntil(() => statuses(webhook, eventIds), found => found.length === eventIds.length && found.every(status => status === "failed"), "the deliveries to fail");
	const recover = (webhook: { id: string }, token: string, body: unknown) => env.stack.request("POST", `/id/v3/webhooks/${webhook.id}/recover`, { token, body });

	beforeAll(async () => {
		// One quick retry: deliveries fail for good within a second.
		env = await startDeliveryStack(database, { env: { DELIVERY_RETRY_SCHEDULE: "200ms" } });
	});
	afterAll(() => env?.stop());

	it("gives every failed delivery in the window one fresh attempt now, answers 202 with the count, and is idempotent", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const sibling = await env.createWebhook(alice.token);
		env.script(webhook, [], { status: 500 });
		env.script(sibling, [], { status: 500 });
		const before = await publishAll(alice, 2);
		await allFailed(webhook, before);
		const since = new Date().toISOString();
		await sleep(20);
		const inWindow = await publishAll(alice, 3);
		await allFailed(webhook, inWindow);
		await allFailed(sibling, inWindow);
		const requestsBefore = env.received(webhook).length;

		env.script(webhook, [], { status: 200 });
		const answer = await recover(webhook, alice.token, { since });
		expect(answer.status).toBe(202);
		expect(answer.body).toEqual({ scheduled: 3, remaining: 0 });
		// Repeated while those attempts are pending (or done): nothing is scheduled twice.
		expect((await recover(webhook, alice.token, { since })).body).toEqual({ scheduled: 0, remaining: 0 });

		await waitUntil(() => statuses(webhook, inWindow), found => found.every(status => status === "succeeded"), "the recovered deliveries to succeed");
		expect((await recover(webhook, alice.token, { since })).body).toEqual({ scheduled: 0, remaining: 0 });
		// One new request per recovered delivery; nothing outside the window, nothing for the sibling.
		expect(env.received(webhook).length - requestsBefore).toBe(3);
		expect(await statuses(webhook, before)).toEqual(["failed", "failed"]);
		expect(await statuses(sibling, inWindow)).toEqual(["failed", "failed", "failed"]);
		const recovered = await db()("deliveries").where({ webhook_id: webhook.id }).whereIn("event_id", inWindow);
		for (const row of recovered) expect(row).toMatchObject({ attempt_count: 3 });

		// `until` closes the window: the older two, and only them.
		const older = await recover(webhook, alice.token, { since: "2000-01-01T00:00:00Z", until: since });
		expect(older.body).toEqual({ scheduled: 2, remaining: 0 });
		await waitUntil(() => statuses(webhook, before), found => found.every(status => status === "succeeded"), "the older deliveries to succeed");
	});

	it("schedules at most 10,000 per call and says how many are left", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		// Disabled, so that the recovered deliveries park instead of sending ten thousand requests.
		await env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice.token, body: { active: false } });
		const total = MAX_RECOVER_BATCH + 5;
		const created = new Date(Date.now() - 60_000).toISOString();
		const messages = Array.from({ length: total }, () => ({
			event_id: crypto.randomUUID(),
			customer_id: alice.id,
			user_id: alice.userId,
			type: "tasking:order_status",
			body: "{}",
			occurred_at: created,
			created_at: created,
		}));
		const deliveries = messages.map(message => ({
			id: timeOrderedUuid(),
			event_id: message.event_id,
			webhook_id: webhook.id,
			customer_id: alice.id,
			status: "failed",
			attempt_count: 6,
			created_at: created,
			updated_at: created,
		}));
		await db().batchInsert("delivery_messages", messages, 200);
		await db().batchInsert("deliveries", deliveries, 200);

		const first = await recover(webhook, alice.token, { since: "2000-01-01T00:00:00Z" });
		expect(first.body).toEqual({ scheduled: MAX_RECOVER_BATCH, remaining: 5 });
		const second = await recover(webhook, alice.token, { since: "2000-01-01T00:00:00Z" });
		expect(second.body).toEqual({ scheduled: 5, remaining: 0 });
		const [{ count }] = await db()("deliveries").where({ webhook_id: webhook.id, status: "failed" }).count({ count: "*" });
		expect(Number(count)).toBe(0);
	});

	it("answers 404 for another customer's webhook or an unknown one, and 422 for bad input, writing nothing", async () => {
		const alice = await newCustomer(env.stack);
		const mallory = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		env.script(webhook, [], { status: 500 });
		const events = await publishAll(alice, 1);
		await allFailed(webhook, events);
		// This webhook's rows only: the previous test's ten thousand recovered deliveries are still
		// being claimed and parked in the background.
		const rowsOfThisWebhook = async () => ({
			deliveries: await db()("deliveries").where({ webhook_id: webhook.id }).orderBy("id"),
			attempts: await db()("delivery_attempt_log as a").join("deliveries as d", "d.id", "a.delivery_id").where("d.webhook_id", webhook.id).select("a.*").orderBy(["a.delivery_id", "a.attempt"]),
			recoveredElsewhere: await db()("deliveries").where({ manual_retry: true }).whereNot({ webhook_id: webhook.id }).whereIn("customer_id", [alice.id, mallory.id]).count({ count: "*" }),
		});
		const snapshot = await rowsOfThisWebhook();

		expectProblem(await recover(webhook, mallory.token, { since: "2000-01-01T00:00:00Z" }), 404);
		expectProblem(await recover({ id: crypto.randomUUID() }, alice.token, { since: "2000-01-01T00:00:00Z" }), 404);
		expectProblem(await recover({ id: "not-a-uuid" }, alice.token, { since: "2000-01-01T00:00:00Z" }), 422);
		const future = new Date(Date.now() + 3_600_000).toISOString();
		const bad: unknown[] = [
			{},
			{ since: "yesterday" },
			{ since: 1_700_000_000 },
			{ since: null },
			{ since: future },
			{ since: "2026-01-02T00:00:00Z", until: "2026-01-01T00:00:00Z" },
			{ since: "2026-01-01T00:00:00Z", until: "2026-01-01T00:00:00Z" },
			{ since: "2000-01-01T00:00:00Z", status: "failed" },
			{ since: "2000-01-01T00:00:00Z", until: "x".repeat(10_000) },
			["2000-01-01T00:00:00Z"],
		];
		for (const body of bad) {
			const response = await recover(webhook, alice.token, body);
			expect([JSON.stringify(body).slice(0, 80), response.status]).toEqual([JSON.stringify(body).slice(0, 80), 422]);
			expect(response.body.errors.length).toBeGreaterThan(0);
		}
		const malformed = await env.stack.request("POST", `/id/v3/webhooks/${webhook.id}/recover`, { token: alice.token, body: "{since:", headers: { "content-type": "application/json" } });
		expectProblem(malformed, 400);
		expect(await rowsOfThisWebhook()).toEqual(snapshot);
	});
});
