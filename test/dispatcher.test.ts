// The dispatcher end to end: events in, signed HTTPS deliveries out to a real receiver, retries
// on the persisted schedule, cancellation and parking, rejected events, and the delivery log
// through the real gateway. On SQLite and PostgreSQL.
import crypto from "node:crypto";
import { testDatabases } from "./helpers/services";
import { orderEvent, sleep, startDeliveryStack, verified, waitUntil, type CreatedWebhook, type DeliveryStack, type OrderEvent } from "./helpers/delivery-stack";
import { verifyDelivery } from "./helpers/https-receiver";
import { TARGET_CACHE_MS } from "../mixins/dispatcher/shared";

const TOPIC = "tasking:order_status";
const OTHER_TOPIC = "imaging:capture_ready";
const RETRY_OFFSETS_MS = [1_000, 2_000, 3_000, 4_000, 5_000];

describe.each(testDatabases())("dispatcher on %s", database => {
	let env: DeliveryStack;

	const db = () => env.stack.db;
	const publish = (event: OrderEvent) => env.stack.app.broker.call("dispatcher.publish", event) as Promise<{ event_id: string; duplicate: boolean; deliveries: number }>;
	const emit = (event: unknown) => env.stack.app.broker.emit("tasking.order_status", event);
	/** A fresh customer per test keeps the tests' webhooks apart; its user is known to `users`. */
	const newCustomer = async () => {
		const id = `cust-${crypto.randomBytes(4).toString("hex")}`;
		const userId = `user-${id}`;
		const token = await env.stack.token(userId, { customer: id });
		await env.stack.request("GET", "/id/v3/user/details", { token });
		return { id, userId, token };
	};
	const order = orderEvent;
	const deliveryOf = async (eventId: string, webhook: CreatedWebhook) => db()("deliveries").where({ event_id: eventId, webhook_id: webhook.id }).first();
	const waitForStatus = (eventId: string, webhook: CreatedWebhook, status: string) =>
		waitUntil(() => deliveryOf(eventId, webhook), row => row?.status === status, `delivery of ${eventId} to be ${status}`);
	const countRows = async (table: string) => Number((await db()(table).count({ count: "*" }))[0].count);

	beforeAll(async () => {
		env = await startDeliveryStack(database, { env: { SECRET_ROTATION_GRACE: "3s" } });
		await env.stack.app.broker.call("topics.register", { topic: OTHER_TOPIC, category: "imaging", name: "Capture ready", description: "A capture is ready" });
	});
	afterAll(() => env?.stop());

	it("fans an event out to every active subscribed webhook of its customer only, signed, with the exact body", async () => {
		const alice = await newCustomer();
		const bob = await newCustomer();
		const first = await env.createWebhook(alice.token);
		const second = await env.createWebhook(alice.token);
		const inactive = await env.createWebhook(alice.token);
		const unsubscribed = await env.createWebhook(alice.token, { events: [OTHER_TOPIC] });
		const otherCustomer = await env.createWebhook(bob.token);
		expect((await env.stack.request("PATCH", `/id/v3/webhooks/${inactive.id}`, { token: alice.token, body: { active: false } })).status).toBe(200);

		const event = order(alice, {
			status: "Fulfilled",
			previous_status: "in progress",
			order_name: "Harbour survey",
			occurred_at: "2026-03-01T12:00:00+02:00",
			details: { status: "overridden?", resolution_m: 0.5, tags: ["a", "b"] },
		});
		const answer = await publish(event);
		expect(answer).toEqual({ event_id: event.event_id, duplicate: false, deliveries: 2 });

		// Persisted before any request: exactly one delivery per active subscribed webhook.
		const rows = await db()("deliveries").where({ event_id: event.event_id });
		expect(rows.map(row => row.webhook_id).sort()).toEqual([first.id, second.id].sort());

		for (const webhook of [first, second]) {
			await waitForStatus(event.event_id!, webhook, "succeeded");
			const [request] = env.received(webhook);
			const delivery = rows.find(row => row.webhook_id === webhook.id);
			expect(request.method).toBe("POST");
			expect(request.headers["content-type"]).toBe("application/json");
			expect(request.headers["user-agent"]).toMatch(/satellite-webhooks/);
			expect(request.headers["webhook-id"]).toBe(`msg_${delivery.id}`);
			const payload = verified(request, webhook.secret);
			expect(payload).toEqual({
				type: TOPIC,
				timestamp: "2026-03-01T10:00:00.000Z",
				data: {
					order_id: event.order_id,
					status: "fulfilled",
					previous_status: "in progress",
					user_id: alice.userId,
					order_name: "Harbour survey",
					resolution_m: 0.5,
					tags: ["a", "b"],
				},
			});
			// Exactly the stored bytes were sent and signed.
			const message = await db()("delivery_messages").where({ event_id: event.event_id }).first();
			expect(request.body).toBe(message.body);
		}
		await sleep(300);
		for (const webhook of [inactive, unsubscribed, otherCustomer]) expect(env.received(webhook)).toHaveLength(0);

		// The other customer's event reaches only the other customer's webhook.
		const acmeEvent = order(bob);
		expect(await publish(acmeEvent)).toMatchObject({ deliveries: 1 });
		await waitForStatus(acmeEvent.event_id!, otherCustomer, "succeeded");
		expect(verified(env.received(otherCustomer)[0], otherCustomer.secret)).toMatchObject({ data: { order_id: acmeEvent.order_id } });
		expect(env.received(first)).toHaveLength(1);
		expect(env.received(second)).toHaveLength(1);
	});

	// Intake keeps each customer's subscribers between batches (lib/subscriber-cache.ts): every
	// change below is followed at once, with no pause, by an event that must see it.
	it("sends the very next event after a webhook change to the webhooks as changed", async () => {
		const alice = await newCustomer();
		const patch = async (webhook: CreatedWebhook, body: object) => expect((await env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice.token, body })).status).toBe(200);
		const recipientsOf = async (event: OrderEvent) => {
			await publish(event);
			return (await db()("deliveries").where({ event_id: event.event_id }).pluck("webhook_id")).sort();
		};
		const first = await env.createWebhook(alice.token);
		expect(await recipientsOf(order(alice))).toEqual([first.id]);

		const second = await env.createWebhook(alice.token);
		expect(await recipientsOf(order(alice))).toEqual([first.id, second.id].sort());
		await patch(second, { events: [OTHER_TOPIC] });
		expect(await recipientsOf(order(alice))).toEqual([first.id]);
		await patch(second, { events: [TOPIC] });
		expect(await recipientsOf(order(alice))).toEqual([first.id, second.id].sort());
		await patch(first, { active: false });
		expect(await recipientsOf(order(alice))).toEqual([second.id]);
		await patch(first, { active: true });
		expect(await recipientsOf(order(alice))).toEqual([first.id, second.id].sort());
		expect((await env.stack.request("DELETE", `/id/v3/webhooks/${second.id}`, { token: alice.token })).status).toBe(204);
		expect(await recipientsOf(order(alice))).toEqual([first.id]);

		// A rotation: the next event is signed with the new secret (and the previous one, in its grace).
		const rotated = await env.stack.request("POST", `/id/v3/webhooks/${first.id}/rotate`, { token: alice.token });
		expect(rotated.status).toBe(200);
		const afterRotation = order(alice);
		await publish(afterRotation);
		await waitForStatus(afterRotation.event_id!, first, "succeeded");
		const request = env.received(first).find(received => received.body.includes(afterRotation.order_id));
		expect(verified(request!, rotated.body.secret)).toMatchObject({ data: { order_id: afterRotation.order_id } });
	});

	// Intake refreshes a busy customer's list in the background before its 5 s deadline
	// (TARGET_CACHE_MS), and the refreshed list renews the worker's targets: without that, the
	// targets would run out while the list is still fresh, and the pump would look them up again.
	it("refreshes a busy customer's webhooks ahead of their deadline and keeps sending without looking them up again", async () => {
		const customer = await newCustomer();
		const webhook = await env.createWebhook(customer.token);
		const broker = env.stack.app.broker;
		const call = broker.call.bind(broker);
		const lookups: Array<{ action: string; params: unknown; at: number }> = [];
		const spy = jest.spyOn(broker, "call").mockImplementation(((action: string, params: unknown, options: unknown) => {
			lookups.push({ action, params, at: Date.now() });
			return call(action, params as object, options as object);
		}) as typeof broker.call);
		const listLoadsOf = () => lookups.filter(({ action, params }) => action === "webhooks.subscribers" && (params as { customerId?: string }).customerId === customer.id);
		// A load that came before the previous one's deadline: a refresh ahead of it, since a list
		// is loaded in the foreground only once missing or past its deadline.
		const refreshedAhead = () => listLoadsOf().some((load, i, loads) => i > 0 && load.at - loads[i - 1].at < TARGET_CACHE_MS);
		const events: OrderEvent[] = [];
		try {
			// At least 6.5 s of events, past the list's and the targets' first deadline; ten in the
			// second before that deadline, when the list is due for its refresh. On a loaded machine
			// a stall can outlast that second, and the list then runs out and is loaded again as
			// usual: the events go on, bounded by their count, until a refresh has come ahead.
			for (let i = 0; i < 400 && (i < 65 || !refreshedAhead()); i += 1) {
				const event = order(customer);
				events.push(event);
				await publish(event);
				await sleep(100);
			}
			for (const event of events) await waitForStatus(event.event_id!, webhook, "succeeded");
		} finally {
			spy.mockRestore();
		}
		const targetLookups = lookups.filter(({ action, params }) => action === "webhooks.resolve" && ((params as { ids?: string[] }).ids ?? []).includes(webhook.id));
		// The first event's load, then a refresh before a list's deadline; no lookup by the worker.
		expect(listLoadsOf().length).toBeGreaterThanOrEqual(2);
		expect(refreshedAhead()).toBe(true);
		expect(targetLookups).toHaveLength(0);
		expect(env.received(webhook)).toHaveLength(events.length);
	});

	it("looks the customer up from user_id when customer_id is absent", async () => {
		const bob = await newCustomer();
		const webhook = await env.createWebhook(bob.token);
		const { customer_id: _ignored, ...event } = order(bob);
		expect(await publish(event as OrderEvent)).toMatchObject({ deliveries: 1 });
		await waitForStatus(event.event_id!, webhook, "succeeded");
	});

	it("delivers the same event_id once per webhook, however often and however it arrives", async () => {
		const alice = await newCustomer();
		const one = await env.createWebhook(alice.token);
		const two = await env.createWebhook(alice.token);
		const event = order(alice);
		const [firstAnswer] = await Promise.all([publish(event), emit(event), emit(event)]);
		const again = await publish({ ...event, status: "failed" });
		expect(again).toEqual({ event_id: event.event_id, duplicate: true, deliveries: 0 });
		expect(firstAnswer.event_id).toBe(event.event_id);
		for (const webhook of [one, two]) await waitForStatus(event.event_id!, webhook, "succeeded");
		await sleep(300);
		expect(Number((await db()("deliveries").where({ event_id: event.event_id }).count({ count: "*" }))[0].count)).toBe(2);
		expect(env.received(one)).toHaveLength(1);
		expect(env.received(two)).toHaveLength(1);
		expect(verified(env.received(one)[0], one.secret)).toMatchObject({ data: { status: "fulfilled" } });
	});

	it("generates an event_id when the producer sends none", async () => {
		const alice = await newCustomer();
		const webhook = await env.createWebhook(alice.token);
		const { event_id: _none, ...event } = order(alice);
		const answer = await publish(event as OrderEvent);
		expect(answer.event_id).toMatch(/^[0-9a-f-]{36}$/);
		await waitForStatus(answer.event_id, webhook, "succeeded");
	});
	it("retries 500, 500, 200 on the schedule: delivered on attempt 3 with the same webhook-id and fresh timestamps", async () => {
		const alice = await newCustomer();
		const webhook = await env.createWebhook(alice.token);
		env.script(webhook, [{ status: 500, body: "no" }, { status: 500 }]);
		const event = order(alice);
		await publish(event);
		const row = await waitForStatus(event.event_id!, webhook, "succeeded");
		expect(row.attempt_count).toBe(3);

		const requests = env.received(webhook);
		expect(requests).toHaveLength(3);
		expect(new Set(requests.map(request => request.headers["webhook-id"]))).toEqual(new Set([`msg_${row.id}`]));
		for (const request of requests) {
			verified(request, webhook.secret);
			// Each attempt is signed afresh: its timestamp is the second it was sent.
			const stamp = Number(request.headers["webhook-timestamp"]);
			expect(Math.abs(stamp - Math.floor(request.receivedAt.getTime() / 1000))).toBeLessThanOrEqual(1);
		}
		expect(Number(requests[2].headers["webhook-timestamp"])).toBeGreaterThan(Number(requests[0].headers["webhook-timestamp"]));
		expect(new Set(requests.map(request => request.body)).size).toBe(1);

		const attempts = await db()("delivery_attempt_log").where({ delivery_id: row.id }).orderBy("attempt");
		expect(attempts.map(attempt => [attempt.attempt, attempt.status_code, Boolean(attempt.success)])).toEqual([
			[1, 500, false],
			[2, 500, false],
			[3, 200, true],
		]);
		// The first attempt is kept in the delivery's own row (migration 014), the later ones in rows of their own.
		const stored = await db()("deliveries").where({ id: row.id }).first();
		expect([stored.first_attempt_status_code, Boolean(stored.first_attempt_success)]).toEqual([500, false]);
		expect((await db()("delivery_attempts").where({ delivery_id: row.id }).orderBy("attempt")).map(attempt => attempt.attempt)).toEqual([2, 3]);
		// The second attempt waited for the first offset (jitter only ever moves it earlier, by at most 10% of the gap).
		const gap = Date.parse(attempts[1].attempted_at) - Date.parse(attempts[0].attempted_at);
		expect(gap).toBeGreaterThanOrEqual(RETRY_OFFSETS_MS[0] * 0.9);
	});

	it("gives up after 5 failed retries: failed, with attempt_count 6, each retry counted from the first attempt", async () => {
		const alice = await newCustomer();
		const webhook = await env.createWebhook(alice.token);
		env.script(webhook, [], { status: 503 });
		const event = order(alice);
		await publish(event);
		const row = await waitUntil(() => deliveryOf(event.event_id!, webhook), found => found?.status === "failed", "the delivery to fail");
		expect(row).toMatchObject({ attempt_count: 6, next_attempt_at: null, last_status_code: 503, last_error_kind: "http_status" });
		expect(env.received(webhook)).toHaveLength(6);

		const attempts = await db()("delivery_attempt_log").where({ delivery_id: row.id }).orderBy("attempt");
		const first = Date.parse(attempts[0].attempted_at);
		attempts.slice(1).forEach((attempt, index) => {
			const offset = Date.parse(attempt.attempted_at) - first;
			const previous = index === 0 ? 0 : RETRY_OFFSETS_MS[index - 1];
			expect(offset).toBeGreaterThanOrEqual(RETRY_OFFSETS_MS[index] - 0.1 * (RETRY_OFFSETS_MS[index] - previous));
		});
		await sleep(1_500);
		expect(env.received(webhook)).toHaveLength(6);
	});

	// On PostgreSQL a batch of results travels as one array per column: text that looks like
	// array syntax, quotes, backslashes, NUL and non-ASCII must arrive exactly (NUL dropped).
	it("keeps a receiver's answer as it came, whatever characters it holds, for operators", async () => {
		const alice = await newCustomer();
		const webhook = await env.createWebhook(alice.token);
		const awkward = '{"a","b"} \\ "quoted" NULL, {} \u0000 ünïcødé 🛰 \' ; DROP TABLE deliveries; --';
		env.script(webhook, [{ status: 500, body: awkward }]);
		const event = order(alice);
		await publish(event);
		const row = await waitForStatus(event.event_id!, webhook, "succeeded");
		const attempts = await db()("delivery_attempt_log").where({ delivery_id: row.id }).orderBy("attempt");
		expect(attempts.map(attempt => [attempt.status_code, attempt.response_excerpt])).toEqual([
			[500, awkward.replace("\u0000", "")],
			[200, expect.any(String)],
		]);
	});

	it("does not follow 3xx answers: they are failed attempts", async () => {
		const alice = await newCustomer();
		const webhook = await env.createWebhook(alice.token);
		const elsewhere = `${env.receiver.url}/elsewhere`;
		env.script(webhook, [{ status: 302, redirectTo: elsewhere }, { status: 301, redirectTo: elsewhere }]);
		const event = order(alice);
		await publish(event);
		const row = await waitForStatus(event.event_id!, webhook, "succeeded");
		const attempts = await db()("delivery_attempt_log").where({ delivery_id: row.id }).orderBy("attempt");
		expect(attempts.map(attempt => attempt.status_code)).toEqual([302, 301, 200]);
		expect(attempts[0]).toMatchObject({ error_kind: "http_status", title: "HTTP Status Error" });
		expect(env.receiver.requests.filter(request => request.path.startsWith("/elsewhere"))).toHaveLength(0);
	});

	it("signs with both secrets during a rotation's grace period, and with the new one only afterwards", async () => {
		const alice = await newCustomer();
		const webhook = await env.createWebhook(alice.token);
		const rotated = await env.stack.request("POST", `/id/v3/webhooks/${webhook.id}/rotate`, { token: alice.token });
		expect(rotated.status).toBe(200);
		const newSecret: string = rotated.body.secret;
		const rotatedAt = Date.now();

		const during = order(alice);
		await publish(during);
		await waitForStatus(during.event_id!, webhook, "succeeded");
		const [duringGrace] = env.received(webhook);
		expect(String(duringGrace.headers["webhook-signature"]).split(" ")).toHaveLength(2);
		expect(verified(duringGrace, newSecret)).toMatchObject({ data: { order_id: during.order_id } });
		expect(verified(duringGrace, webhook.secret)).toMatchObject({ data: { order_id: during.order_id } });

		// SECRET_ROTATION_GRACE is 3 s in this suite.
		await sleep(Math.max(0, rotatedAt + 3_500 - Date.now()));
		const after = order(alice);
		await publish(after);
		await waitForStatus(after.event_id!, webhook, "succeeded");
		const afterGrace = env.received(webhook)[1];
		expect(String(afterGrace.headers["webhook-signature"]).split(" ")).toHaveLength(1);
		expect(verified(afterGrace, newSecret)).toMatchObject({ data: { order_id: after.order_id } });
		expect(() => verifyDelivery(afterGrace, webhook.secret)).toThrow();
	});

	it("cancels pending deliveries when their webhook is deleted", async () => {
		const alice = await newCustomer();
		const webhook = await env.createWebhook(alice.token);
		env.script(webhook, [], { status: 500 });
		const event = order(alice);
		await publish(event);
		await waitUntil(() => deliveryOf(event.event_id!, webhook), row => row?.attempt_count === 1, "the first attempt");
		expect((await env.stack.request("DELETE", `/id/v3/webhooks/${webhook.id}`, { token: alice.token })).status).toBe(204);
		const row = await waitForStatus(event.event_id!, webhook, "cancelled");
		expect(row).toMatchObject({ attempt_count: 1, next_attempt_at: null });
		// Past the time the next two retries were due: nothing more was sent.
		await sleep(2_500);
		expect(env.received(webhook)).toHaveLength(1);
		expect(await deliveryOf(event.event_id!, webhook)).toMatchObject({ status: "cancelled", attempt_count: 1 });
	});

	it("stops deliveries to a disabled webhook without counting attempts, and resumes them when it is enabled again", async () => {
		const alice = await newCustomer();
		const webhook = await env.createWebhook(alice.token);
		env.script(webhook, [{ status: 500 }]);
		const event = order(alice);
		await publish(event);
		await waitUntil(() => deliveryOf(event.event_id!, webhook), row => row?.attempt_count === 1, "the first attempt");
		expect((await env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice.token, body: { active: false } })).status).toBe(200);

		// The retry falls due while the webhook is disabled: it is parked, not attempted.
		const parked = await waitUntil(() => deliveryOf(event.event_id!, webhook), row => Boolean(row?.parked), "the delivery to be parked");
		expect(parked).toMatchObject({ status: "pending", attempt_count: 1, next_attempt_at: null, lease_id: null });
		// New events are not delivered to a disabled webhook at all.
		const whileDisabled = order(alice);
		expect(await publish(whileDisabled)).toMatchObject({ deliveries: 0 });
		await sleep(1_500);
		expect(env.received(webhook)).toHaveLength(1);
		const log = await env.stack.request("GET", `/id/v3/webhooks/${webhook.id}/deliveries/${parked.id}`, { token: alice.token });
		expect(log.body).toMatchObject({ status: "pending", attempt_count: 1, next_attempt_at: null });

		expect((await env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice.token, body: { active: true } })).status).toBe(200);
		const done = await waitForStatus(event.event_id!, webhook, "succeeded");
		expect(done).toMatchObject({ attempt_count: 2, parked: expect.anything() });
		expect(Boolean(done.parked)).toBe(false);
		expect(env.received(webhook)).toHaveLength(2);
	});

	it("records invalid events as rejected, writes nothing else, and keeps working", async () => {
		const alice = await newCustomer();
		const webhook = await env.createWebhook(alice.token);
		const tables = ["delivery_messages", "deliveries", "delivery_attempts"];
		const before = await Promise.all(tables.map(countRows));
		const rejectedBefore = await countRows("delivery_rejected_events");
		const valid = order(alice);
		const invalid: Array<[string, unknown]> = [
			["order_id", { ...valid, event_id: crypto.randomUUID(), order_id: 123 }],
			["user_id", { ...valid, event_id: crypto.randomUUID(), user_id: undefined }],
			["status", { ...valid, event_id: crypto.randomUUID(), status: "shipped" }],
			["details", { ...valid, event_id: crypto.randomUUID(), details: { blob: "x".repeat(20_000) } }],
			["event_id", { ...valid, event_id: "not-a-uuid" }],
			["event_id", { ...valid, event_id: "nul\u0000inside", order_name: "also \u0000 here" }],
			["occurred_at", { ...valid, event_id: crypto.randomUUID(), occurred_at: "yesterday" }],
			["details", { ...valid, event_id: crypto.randomUUID(), details: ["not", "an", "object"] }],
			["", "just a string"],
			["", null],
			["user_id", { ...valid, event_id: crypto.randomUUID(), customer_id: undefined, user_id: "nobody-we-know" }],
		];
		for (const [path, payload] of invalid) {
			const failure: any = await env.stack.app.broker.call("dispatcher.publish", payload as object).catch(err => err);
			expect(failure).toMatchObject({ code: 422 });
			if (path) expect(JSON.stringify(failure.data)).toContain(path);
			emit(payload);
		}
		// Every payload was recorded twice: once from publish, once from the event.
		await waitUntil(countRows.bind(null, "delivery_rejected_events"), count => count === rejectedBefore + invalid.length * 2, "the rejections to be recorded");
		const rejected = await db()("delivery_rejected_events").orderBy("id", "desc").limit(invalid.length * 2);
		expect(new Set(rejected.map(row => row.source))).toEqual(new Set(["event", "publish"]));
		for (const row of rejected) {
			expect(row.reason.length).toBeGreaterThan(0);
			expect(row.excerpt.length).toBeLessThanOrEqual(2_001);
		}
		expect(rejected.filter(row => /^details: .*16384 bytes/.test(row.reason))).toHaveLength(2);
		expect(rejected.filter(row => /unknown user/.test(row.reason))).toHaveLength(2);
		expect(await Promise.all(tables.map(countRows))).toEqual(before);
		expect(env.received(webhook)).toHaveLength(0);

		// The service still works.
		await publish(valid);
		await waitForStatus(valid.event_id!, webhook, "succeeded");
	});
});
