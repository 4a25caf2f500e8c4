// GET /id/v3/webhooks/{id}/stats: a webhook's deliveries and attempts per hour over 24 hours,
// counted by the database, isolated per customer. On SQLite and PostgreSQL, with real deliveries
// to a real HTTPS receiver.
import crypto from "node:crypto";
import { expectProblem } from "./helpers/stack";
import { testDatabases } from "./helpers/services";
import { startDeliveryStack, waitUntil, type CreatedWebhook, type DeliveryStack } from "./helpers/delivery-stack";

const HOUR_MS = 3_600_000;

describe.each(testDatabases())("webhook stats on %s", database => {
	let env: DeliveryStack;
	const request = (method: string, path: string, token: string) => env.stack.request(method, path, { token });
	const newCustomer = async () => {
		const id = `cust-${crypto.randomBytes(4).toString("hex")}`;
		return { id, userId: `user-${id}`, token: await env.stack.token(`user-${id}`, { customer: id }) };
	};
	const publish = (customer: { id: string; userId: string }) =>
		env.stack.app.broker.call("dispatcher.publish", {
			event_id: crypto.randomUUID(),
			customer_id: customer.id,
			user_id: customer.userId,
			order_id: `order-${crypto.randomBytes(3).toString("hex")}`,
			status: "staged",
		});
	const deliveriesOf = (webhook: CreatedWebhook) => env.stack.db("deliveries").where({ webhook_id: webhook.id }).orderBy("created_at");

	beforeAll(async () => {
		// One retry far away: a failed first attempt stays pending, so the counts do not move under the test.
		env = await startDeliveryStack(database, { env: { DELIVERY_RETRY_SCHEDULE: "1h" } });
	});
	afterAll(() => env?.stop());

	it("counts deliveries by status and attempts by outcome, per hour, oldest hour first", async () => {
		const alice = await newCustomer();
		const webhook = await env.createWebhook(alice.token);
		env.script(webhook, [{ status: 200 }, { status: 200 }, { status: 500 }]);
		for (let i = 0; i < 3; i += 1) await publish(alice);
		await waitUntil(() => env.stack.db("delivery_attempt_log").whereIn("delivery_id", env.stack.db("deliveries").select("id").where({ webhook_id: webhook.id })), rows => rows.length === 3, "three attempts");

		// Two more deliveries, moved back in time: one three hours ago, one outside the window.
		await publish(alice);
		await publish(alice);
		const rows = await waitUntil(() => deliveriesOf(webhook), found => found.length === 5 && found.every(row => row.attempt_count >= 1), "five attempted deliveries");
		const [threeHoursAgo, dayAndHalfAgo] = [new Date(Date.now() - 3 * HOUR_MS).toISOString(), new Date(Date.now() - 36 * HOUR_MS).toISOString()];
		// Their only attempt is their first, which the delivery's own row keeps.
		await env.stack.db("deliveries").where({ id: rows[3].id }).update({ created_at: threeHoursAgo, first_attempt_at: threeHoursAgo });
		await env.stack.db("deliveries").where({ id: rows[4].id }).update({ created_at: dayAndHalfAgo, first_attempt_at: dayAndHalfAgo });

		const response = await request("GET", `/id/v3/webhooks/${webhook.id}/stats?window=24h`, alice.token);
		expect(response.status).toBe(200);
		const stats = response.body;
		expect(stats).toMatchObject({ webhook_id: webhook.id, window: "24h" });
		expect(stats.buckets).toHaveLength(24);
		const starts = stats.buckets.map((bucket: { start: string }) => Date.parse(bucket.start));
		expect(starts.every((start: number, i: number) => start % HOUR_MS === 0 && (i === 0 || start - starts[i - 1] === HOUR_MS))).toBe(true);
		expect(stats.from).toBe(stats.buckets[0].start);
		expect(Date.parse(stats.to)).toBe(starts[23] + HOUR_MS);
		expect(Date.parse(stats.to)).toBeGreaterThan(Date.now() - 60_000);

		const bucketAt = (iso: string) => stats.buckets.find((bucket: { start: string }) => bucket.start.slice(0, 13) === iso.slice(0, 13));
		// The two later deliveries answered 200 by default (the script ran out), so: 4 succeeded and 1 pending in the window.
		const current = stats.buckets[23];
		const older = bucketAt(threeHoursAgo);
		expect(older).toBeDefined();
		expect(current.succeeded + older.succeeded).toBe(3);
		expect(current.pending + older.pending).toBe(1);
		expect(older.succeeded + older.pending).toBe(1);
		expect(older.attempts_succeeded + older.attempts_failed).toBe(1);
		expect(current.attempts_failed).toBe(1);
		expect(stats.totals).toEqual({ succeeded: 3, failed: 0, pending: 1, cancelled: 0, attempts_succeeded: 3, attempts_failed: 1 });
		// Every hour without deliveries is present with zeros.
		const quiet = stats.buckets.filter((bucket: { start: string }) => bucket !== current && bucket !== older);
		expect(quiet.every((bucket: Record<string, unknown>) => Object.entries(bucket).every(([key, value]) => key === "start" || value === 0))).toBe(true);

		// window defaults to 24h.
		const byDefault = await request("GET", `/id/v3/webhooks/${webhook.id}/stats`, alice.token);
		expect(byDefault.body.totals).toEqual(stats.totals);
	});

	it("counts a later attempt, a row of delivery_attempts, beside the first one kept in the delivery's row", async () => {
		const alice = await newCustomer();
		const webhook = await env.createWebhook(alice.token);
		env.script(webhook, [{ status: 500 }]);
		await publish(alice);
		const [row] = await waitUntil(() => deliveriesOf(webhook), rows => rows.length === 1 && rows[0].attempt_count === 1, "the first attempt");
		expect((await request("POST", `/id/v3/webhooks/${webhook.id}/deliveries/${row.id}/retry`, alice.token)).status).toBe(202);
		await waitUntil(() => deliveriesOf(webhook), rows => rows[0].status === "succeeded", "the retry by hand");
		expect((await env.stack.db("delivery_attempts").where({ delivery_id: row.id })).map(attempt => attempt.attempt)).toEqual([2]);
		const response = await request("GET", `/id/v3/webhooks/${webhook.id}/stats`, alice.token);
		expect(response.body.totals).toEqual({ succeeded: 1, failed: 0, pending: 0, cancelled: 0, attempts_succeeded: 1, attempts_failed: 1 });
	});

	it("counts a delivery waiting for its retry as pending, and nothing of other webhooks or customers", async () => {
		const alice = await newCustomer();
		const bob = await newCustomer();
		const [quiet, busy] = [await env.createWebhook(alice.token), await env.createWebhook(alice.token)];
		const bobs = await env.createWebhook(bob.token);
		await publish(bob);
		await publish(bob);
		await waitUntil(() => deliveriesOf(bobs), rows => rows.length === 2, "bob's deliveries");
		const response = await request("GET", `/id/v3/webhooks/${quiet.id}/stats`, alice.token);
		expect(response.status).toBe(200);
		expect(response.body.totals).toEqual({ succeeded: 0, failed: 0, pending: 0, cancelled: 0, attempts_succeeded: 0, attempts_failed: 0 });

		env.script(busy, [{ status: 500 }]);
		await publish(alice);
		await waitUntil(() => deliveriesOf(busy), rows => rows.length === 1 && rows[0].attempt_count === 1, "a failed first attempt");
		expect((await request("GET", `/id/v3/webhooks/${busy.id}/stats`, alice.token)).body.totals).toMatchObject({ pending: 1, attempts_failed: 1 });
		const bobStats = await request("GET", `/id/v3/webhooks/${bobs.id}/stats`, bob.token);
		expect(bobStats.body.totals).toMatchObject({ succeeded: 2 });
	});

	it("answers 404 for another customer's webhook and for an unknown one, exactly alike", async () => {
		const alice = await newCustomer();
		const mallory = await newCustomer();
		const webhook = await env.createWebhook(alice.token);
		const theirs = await request("GET", `/id/v3/webhooks/${webhook.id}/stats`, mallory.token);
		const unknown = await request("GET", `/id/v3/webhooks/${crypto.randomUUID()}/stats`, mallory.token);
		expectProblem(theirs, 404);
		expectProblem(unknown, 404);
		expect(theirs.body).toEqual(unknown.body);
	});

	it.each([
		["an unknown window", "?window=7d", "window"],
		["an empty window", "?window=", "window"],
		["an SQL fragment", "?window=24h'%20or%201=1--", "window"],
		["a repeated window", "?window=24h&window=24h", "window"],
		["an oversized window", `?window=${"24h".repeat(3000)}`, "window"],
		["a window of the wrong type", "?window[a]=24h", "window[a]"],
		["an unknown parameter", "?window=24h&customer_id=acme", "customer_id"],
	])("refuses %s with 422 naming the parameter", async (_what, query, path) => {
		const alice = await newCustomer();
		const webhook = await env.createWebhook(alice.token);
		const response = await request("GET", `/id/v3/webhooks/${webhook.id}/stats${query}`, alice.token);
		expectProblem(response, 422);
		expect(response.body.errors).toEqual(expect.arrayContaining([expect.objectContaining({ path })]));
	});

	it("refuses a malformed id with 422 and a missing token with 401", async () => {
		const alice = await newCustomer();
		const malformed = await request("GET", "/id/v3/webhooks/not-a-uuid/stats", alice.token);
		expectProblem(malformed, 422);
		expect(malformed.body.errors).toEqual([expect.objectContaining({ path: "id" })]);
		const webhook = await env.createWebhook(alice.token);
		expectProblem(await env.stack.request("GET", `/id/v3/webhooks/${webhook.id}/stats`), 401);
	});
});
