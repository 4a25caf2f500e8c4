// Endpoint lifecycle end to end, with a real HTTPS receiver: 410 Gone disables a webhook, a
// Retry-After delays the next attempt within the retry window, a webhook failing for
// WEBHOOK_DISABLE_AFTER disables itself, the customer hears of it through `webhook:disabled`, and
// re-enabling resumes what was parked. On SQLite and PostgreSQL.
import { testDatabases } from "./helpers/services";
import { metricTotal, newCustomer, orderEvent, sleep, startDeliveryStack, verified, waitUntil, type CreatedWebhook, type DeliveryStack, type OrderEvent } from "./helpers/delivery-stack";
import { WebhookDisabledMessage } from "../lib/schemas/webhooks";

const RETRY_OFFSETS_MS = [1_000, 2_000, 3_000, 4_000, 5_000];

describe.each(testDatabases())("webhook lifecycle on %s", database => {
	let env: DeliveryStack;

	const db = () => env.stack.db;
	const publish = (event: OrderEvent) => env.stack.app.broker.call("dispatcher.publish", event) as Promise<{ deliveries: number }>;
	const deliveryOf = (eventId: string, webhook: CreatedWebhook) => db()("deliveries").where({ event_id: eventId, webhook_id: webhook.id }).first();
	const getWebhook = async (webhook: CreatedWebhook, token: string) => (await env.stack.request("GET", `/id/v3/webhooks/${webhook.id}`, { token })).body;
	const disables = (reason: string) => metricTotal(env.stack.app.broker, "webhooks_disabled_total", { reason });
	// The counter is bumped after the disable commits, so a read just after the API shows the webhook
	// disabled may not see it yet: wait for it to rise, then the test checks by how much.
	const disablesAfter = (reason: string, before: number) => waitUntil(() => disables(reason), count => count > before, `the ${reason} disable to be counted`);

	beforeAll(async () => {
		env = await startDeliveryStack(database, { env: { WEBHOOK_DISABLE_AFTER: "2500ms" } });
	});
	afterAll(() => env?.stop());

	it("lists webhook:disabled among the topics a webhook can subscribe to, but not among email topics", async () => {
		const alice = await newCustomer(env.stack);
		const topics = await env.stack.request("GET", "/id/v3/webhooks/events", { token: alice.token });
		expect(topics.body.map((topic: { topic: string }) => topic.topic)).toEqual(["tasking:order_status", "webhook:disabled"]);
		const details = await env.stack.request("GET", "/id/v3/user/details", { token: alice.token });
		expect(JSON.stringify(details.body)).not.toContain("webhook:disabled");
	});

	it("disables a webhook whose URL answers 410 Gone, parks its deliveries, tells the customer, and resumes them when re-enabled", async () => {
		const alice = await newCustomer(env.stack);
		const gone = await env.createWebhook(alice.token);
		const watcher = await env.createWebhook(alice.token, { events: ["webhook:disabled"] });
		const bystander = await newCustomer(env.stack);
		const otherWatcher = await env.createWebhook(bystander.token, { events: ["webhook:disabled"] });
		env.script(gone, [{ status: 410 }], { status: 410 });
		const goneBefore = await disables("gone");

		const first = orderEvent(alice);
		await publish(first);
		const disabled = await waitUntil(() => getWebhook(gone, alice.token), body => body.active === false, "the webhook to be disabled");
		expect(disabled).toMatchObject({ active: false, disabled_reason: "gone", disabled_at: expect.any(String) });
		expect(await disablesAfter("gone", goneBefore)).toBe(goneBefore + 1);

		// The delivery that got the 410 is parked, its attempt recorded, with no next attempt.
		// The disable may park the row before the attempt's result (written in a batch) lands.
		const parked = await waitUntil(() => deliveryOf(first.event_id!, gone), row => Boolean(row?.parked) && row.attempt_count === 1, "the delivery to be parked with its attempt written");
		expect(parked).toMatchObject({ status: "pending", attempt_count: 1, next_attempt_at: null, last_status_code: 410 });
		const log = await env.stack.request("GET", `/id/v3/webhooks/${gone.id}/deliveries/${parked.id}`, { token: alice.token });
		expect(log.body).toMatchObject({ status: "pending", attempt_count: 1, next_attempt_at: null });

		// The watcher gets a signed webhook:disabled message; another customer's watcher gets nothing.
		const [notice] = await waitUntil(() => env.received(watcher), requests => requests.length >= 1, "the webhook:disabled delivery");
		const payload = verified(notice, watcher.secret);
		expect(WebhookDisabledMessage.strict().safeParse(payload).success).toBe(true);
		expect(payload).toEqual({
			type: "webhook:disabled",
			timestamp: disabled.disabled_at,
			data: { webhook_id: gone.id, name: disabled.name, url: gone.url, reason: "gone", disabled_at: disabled.disabled_at },
		});
		const noticeRow = await db()("deliveries as d").join("delivery_messages as m", "m.event_id", "d.event_id").where({ "d.webhook_id": watcher.id }).first("d.status", "m.type");
		expect(noticeRow).toEqual({ status: expect.any(String), type: "webhook:disabled" });
		await sleep(500);
		// One notice, though both the broadcast and the disabling dispatcher write it.
		expect(await db()("deliveries").where({ webhook_id: watcher.id })).toHaveLength(1);
		expect(env.received(watcher)).toHaveLength(1);
		expect(env.received(otherWatcher)).toHaveLength(0);
		expect(env.received(gone)).toHaveLength(1);

		// Re-enabled: the reason is cleared and the parked delivery goes out.
		env.script(gone, [], { status: 200 });
		const enabled = await env.stack.request("PATCH", `/id/v3/webhooks/${gone.id}`, { token: alice.token, body: { active: true } });
		expect(enabled.body).toMatchObject({ active: true, disabled_reason: null, disabled_at: null });
		const done = await waitUntil(() => deliveryOf(first.event_id!, gone), row => row?.status === "succeeded", "the parked delivery to be delivered");
		expect(done).toMatchObject({ attempt_count: 2 });
	});

	it("shows no next attempt for a disabled webhook's pending deliveries at once, and resumes them on re-enable", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		env.script(webhook, [{ status: 500 }]);
		const event = orderEvent(alice);
		await publish(event);
		const failedOnce = await waitUntil(() => deliveryOf(event.event_id!, webhook), row => row?.attempt_count === 1 && row.lease_id === null, "the first attempt");
		expect(failedOnce.next_attempt_at).not.toBeNull();

		const patched = await env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice.token, body: { active: false } });
		expect(patched.body).toMatchObject({ active: false, disabled_reason: "user" });
		// Read right after the PATCH: no waiting for the retry to fall due.
		const log = await env.stack.request("GET", `/id/v3/webhooks/${webhook.id}/deliveries?status=pending`, { token: alice.token });
		expect(log.body.deliveries).toEqual([expect.objectContaining({ id: failedOnce.id, next_attempt_at: null })]);
		const row = await waitUntil(() => deliveryOf(event.event_id!, webhook), found => Boolean(found?.parked), "the row to be parked");
		expect(row).toMatchObject({ next_attempt_at: null, attempt_count: 1 });

		await env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice.token, body: { active: true } });
		await waitUntil(() => deliveryOf(event.event_id!, webhook), found => found?.status === "succeeded", "the delivery after re-enabling");
	});

	it("parks an attempt that was in flight when the webhook was disabled: its retry waits for re-enabling, and no second worker gets it meanwhile", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		// The receiver holds the first attempt until the webhook has been disabled, then fails it.
		let releaseAttempt!: () => void;
		const disabledMeanwhile = new Promise<void>(resolve => (releaseAttempt = resolve));
		let attemptArrived!: () => void;
		const arrived = new Promise<void>(resolve => (attemptArrived = resolve));
		env.script(webhook, [
			async () => {
				attemptArrived();
				await disabledMeanwhile;
				return { status: 500 };
			},
		]);
		const event = orderEvent(alice);
		await publish(event);
		await arrived;

		const patched = await env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice.token, body: { active: false } });
		expect(patched.body).toMatchObject({ active: false });
		// Parked at once, though leased: no next attempt, and the lease stays with the attempt in flight.
		const whileInFlight = await waitUntil(() => deliveryOf(event.event_id!, webhook), row => Boolean(row?.parked), "the leased row to be parked");
		expect(whileInFlight).toMatchObject({ status: "pending", attempt_count: 0, next_attempt_at: null, lease_id: expect.any(String) });
		// A hand retry must not take the row from under the attempt in flight.
		const retried = await env.stack.request("POST", `/id/v3/webhooks/${webhook.id}/deliveries/${whileInFlight.id}/retry`, { token: alice.token });
		expect(retried.status).toBe(202);
		expect(await deliveryOf(event.event_id!, webhook)).toMatchObject({ lease_id: whileInFlight.lease_id });

		releaseAttempt();
		// The 500 is recorded, and the retry it would have scheduled waits for the webhook.
		const written = await waitUntil(() => deliveryOf(event.event_id!, webhook), row => row?.attempt_count === 1, "the failed attempt to be written");
		expect(written).toMatchObject({ status: "pending", parked: expect.anything(), next_attempt_at: null, lease_id: null, last_status_code: 500 });
		expect(Boolean(written.parked)).toBe(true);
		await sleep(1_500);
		expect(env.received(webhook)).toHaveLength(1);

		await env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice.token, body: { active: true } });
		const done = await waitUntil(() => deliveryOf(event.event_id!, webhook), row => row?.status === "succeeded", "the delivery after re-enabling");
		expect(done).toMatchObject({ attempt_count: 2 });
		expect(env.received(webhook)).toHaveLength(2);
	});

	it("waits at least as long as a 429's Retry-After in seconds before the next attempt", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		env.script(webhook, [{ status: 429, headers: { "retry-after": "2" } }]);
		const event = orderEvent(alice);
		await publish(event);
		const done = await waitUntil(() => deliveryOf(event.event_id!, webhook), row => row?.status === "succeeded", "the retried delivery");
		expect(done.attempt_count).toBe(2);
		const [first, second] = env.received(webhook);
		// The schedule alone would retry after 1 s (minus jitter); the receiver asked for 2 s.
		expect(second.receivedAt.getTime() - first.receivedAt.getTime()).toBeGreaterThanOrEqual(2_000);
		const attempts = await db()("delivery_attempt_log").where({ delivery_id: done.id }).orderBy("attempt");
		expect(attempts.map(attempt => attempt.status_code)).toEqual([429, 200]);
	});

	it("honours a 503's Retry-After HTTP date, and clamps one past the retry window to its end", async () => {
		const alice = await newCustomer(env.stack);
		const dated = await env.createWebhook(alice.token);
		const far = await env.createWebhook(alice.token);
		// HTTP dates have whole seconds: 3 s ahead, rounded up, is after the schedule's 1 s.
		const askedFor = new Date(Math.ceil((Date.now() + 3_000) / 1000) * 1000);
		env.script(dated, [{ status: 503, headers: { "retry-after": askedFor.toUTCString() } }], { hang: true });
		env.script(far, [{ status: 503, headers: { "retry-after": "86400" } }], { hang: true });
		const event = orderEvent(alice);
		await publish(event);

		const datedRow = await waitUntil(() => deliveryOf(event.event_id!, dated), row => row?.attempt_count === 1 && row.lease_id === null, "the dated 503 to be recorded");
		expect(datedRow.next_attempt_at).toBe(askedFor.toISOString());

		const farRow = await waitUntil(() => deliveryOf(event.event_id!, far), row => row?.attempt_count === 1 && row.lease_id === null, "the far 503 to be recorded");
		// Not a day later: the last retry of the window (first attempt + last offset).
		const windowEnd = new Date(farRow.first_attempt_at).getTime() + RETRY_OFFSETS_MS[RETRY_OFFSETS_MS.length - 1];
		expect(new Date(farRow.next_attempt_at).getTime()).toBe(windowEnd);
		// Both receivers hang from here on; delete the webhooks so nothing keeps retrying.
		for (const webhook of [dated, far]) await env.stack.request("DELETE", `/id/v3/webhooks/${webhook.id}`, { token: alice.token });
	});

	it("disables a webhook whose every attempt failed for WEBHOOK_DISABLE_AFTER over several messages, and tells the customer", async () => {
		const alice = await newCustomer(env.stack);
		const dead = await env.createWebhook(alice.token);
		const flaky = await env.createWebhook(alice.token);
		const watcher = await env.createWebhook(alice.token, { events: ["webhook:disabled"] });
		env.script(dead, [], { status: 500 });
		// Fails most attempts, but every third one succeeds: it is not dead.
		let flakyCalls = 0;
		env.script(flaky, [], () => ({ status: ++flakyCalls % 3 === 0 ? 200 : 500 }));
		const failingBefore = await disables("failing");

		const events = [orderEvent(alice), orderEvent(alice), orderEvent(alice)];
		for (const event of events) await publish(event);
		const disabled = await waitUntil(() => getWebhook(dead, alice.token), body => body.active === false, "the failing webhook to be disabled");
		expect(disabled).toMatchObject({ disabled_reason: "failing" });
		expect(await disablesAfter("failing", failingBefore)).toBe(failingBefore + 1);
		// Its failure streak lasted at least WEBHOOK_DISABLE_AFTER: the first attempt is that old.
		const attempts = await db()("delivery_attempt_log as a").join("deliveries as d", "d.id", "a.delivery_id").where({ "d.webhook_id": dead.id }).select("a.attempted_at", "a.success");
		expect(attempts.every(attempt => !attempt.success)).toBe(true);
		const firstFailure = Math.min(...attempts.map(attempt => new Date(attempt.attempted_at).getTime()));
		expect(new Date(disabled.disabled_at).getTime() - firstFailure).toBeGreaterThanOrEqual(2_500);

		const [notice] = await waitUntil(() => env.received(watcher), requests => requests.length >= 1, "the webhook:disabled delivery");
		expect(verified(notice, watcher.secret)).toMatchObject({ type: "webhook:disabled", data: { webhook_id: dead.id, reason: "failing" } });
		// Everything still pending for it is parked: every one of its deliveries, since the retry
		// window (5 s) outlasts WEBHOOK_DISABLE_AFTER (2.5 s).
		const pending = await db()("deliveries").where({ webhook_id: dead.id, status: "pending" });
		expect(pending).toHaveLength(events.length);
		for (const row of pending) expect({ next_attempt_at: row.next_attempt_at, parked: Boolean(row.parked) }).toEqual({ next_attempt_at: null, parked: true });

		// The flaky webhook ran through the same time and stays active.
		await waitUntil(() => db()("deliveries").where({ webhook_id: flaky.id, status: "pending" }), rows => rows.length === 0, "the flaky webhook's deliveries to finish");
		expect(await getWebhook(flaky, alice.token)).toMatchObject({ active: true, disabled_reason: null });
		expect(flakyCalls).toBeGreaterThanOrEqual(3);
	});

	it("refuses malformed webhooks.disable calls, ignores malformed webhooks.disabled events and other customers' names, writing nothing", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const watcher = await env.createWebhook(alice.token, { events: ["webhook:disabled"] });
		const broker = env.stack.app.broker;
		for (const params of [{}, { id: webhook.id }, { id: webhook.id, reason: "user" }, { id: webhook.id, reason: "bored" }, { id: "x", reason: "gone" }, { id: webhook.id, reason: "gone", extra: 1 }]) {
			await expect(broker.call("webhooks.disable", params)).rejects.toMatchObject({ code: 422 });
		}
		// An id nobody has: nothing to disable.
		expect(await broker.call("webhooks.disable", { id: "00000000-0000-4000-8000-000000000000", reason: "gone" })).toEqual({ disabled: false, webhook: null });
		expect(await getWebhook(webhook, alice.token)).toMatchObject({ active: true, disabled_reason: null });

		const messagesBefore = Number((await db()("delivery_messages").count({ count: "*" }))[0].count);
		const valid = { id: webhook.id, customerId: alice.id, name: "x", url: webhook.url, reason: "gone", disabled_at: new Date().toISOString() };
		for (const payload of [null, "disabled", { ...valid, customerId: undefined }, { ...valid, reason: "bored" }, { ...valid, disabled_at: "yesterday" }, { ...valid, id: "1; DROP TABLE deliveries" }, { ...valid, name: "n".repeat(5_000) }]) {
			broker.broadcast("webhooks.disabled", payload);
		}
		await sleep(500);
		expect(Number((await db()("delivery_messages").count({ count: "*" }))[0].count)).toBe(messagesBefore);
		expect(env.received(watcher)).toHaveLength(0);
		expect(await getWebhook(webhook, alice.token)).toMatchObject({ active: true });
	});
});
