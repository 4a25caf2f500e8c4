// Retention with a test-sized RETENTION_PERIOD, on SQLite and PostgreSQL: old finished messages,
// deliveries, attempts, finished emails and rejected events go; pending work and anything
// younger than the period stay; a previous secret is erased once its grace is over. Runs the
// services' own `prune` actions, and the jobs with tiny batches to walk past pending work.
import crypto from "node:crypto";
import { testDatabases } from "./helpers/services";
import { metricTotal, newCustomer, orderEvent, sleep, startDeliveryStack, waitUntil, type DeliveryStack, type OrderEvent } from "./helpers/delivery-stack";
import { runPruneJobs } from "../lib/retention";
import { DISPATCHER_PRUNE_JOBS } from "../mixins/dispatcher/retention";

const PERIOD_MS = 3_000;

describe.each(testDatabases())("retention on %s", database => {
	let env: DeliveryStack;

	const db = () => env.stack.db;
	const count = async (table: string, where: Record<string, unknown> = {}) => Number((await db()(table).where(where).count({ count: "*" }))[0].count);
	const publish = (event: OrderEvent) => env.stack.app.broker.call("dispatcher.publish", event);
	/** The broker event reaches both the dispatcher and the notifier (the email). */
	const emit = (event: OrderEvent) => env.stack.app.broker.emit("tasking.order_status", event);

	beforeAll(async () => {
		env = await startDeliveryStack(database, { env: { RETENTION_PERIOD: `${PERIOD_MS}ms`, SECRET_ROTATION_GRACE: "1s" } });
	});
	afterAll(() => env?.stop());

	it("prunes finished rows older than the period, keeps pending and younger ones, and erases expired previous secrets", async () => {
		const alice = await newCustomer(env.stack, { signIn: true });
		await env.stack.request("PUT", "/id/v3/user/settings", {
			token: alice.token,
			body: { notifications: [{ category: "tasking", settings: [{ topic: "tasking:order_status", email: true }] }] },
		});
		const healthy = await env.createWebhook(alice.token);
		const parked = await env.createWebhook(alice.token);
		env.script(parked, [], { status: 500 });

		// Old work: delivered events, a parked (pending) delivery, a sent email, a rejected event.
		const old = [orderEvent(alice), orderEvent(alice)];
		for (const event of old) await emit(event);
		await waitUntil(() => count("deliveries", { webhook_id: healthy.id, status: "succeeded" }), n => n === 2, "the old deliveries");
		await waitUntil(() => count("deliveries", { webhook_id: parked.id }), n => n === 2, "the parked webhook's deliveries");
		await waitUntil(() => db()("deliveries").where({ webhook_id: parked.id }).max({ attempts: "attempt_count" }), rows => Number(rows[0].attempts) >= 1, "a failed attempt");
		await env.stack.request("PATCH", `/id/v3/webhooks/${parked.id}`, { token: alice.token, body: { active: false } });
		await waitUntil(() => count("deliveries", { webhook_id: parked.id, status: "pending", parked: true }), n => n === 2, "both to be parked");
		await waitUntil(() => count("email_outbox", { user_id: alice.userId, status: "sent" }), n => n === 2, "the emails");
		await expect(publish({ ...orderEvent(alice), status: "exploded" } as OrderEvent)).rejects.toThrow();
		const rotated = await env.stack.request("POST", `/id/v3/webhooks/${healthy.id}/rotate`, { token: alice.token });
		expect(rotated.status).toBe(200);
		// A pending email that was never sent stays, however old.
		const pendingEmailId = crypto.randomUUID();
		await db()("email_outbox").insert({
			id: pendingEmailId,
			event_key: pendingEmailId,
			user_id: alice.userId,
			order_id: "o-pending",
			order_status: "fulfilled",
			order_snapshot: "{}",
			message_id: `<${pendingEmailId}@example.com>`,
			status: "pending",
			next_attempt_at: new Date(Date.now() + 86_400_000).toISOString(),
			created_at: new Date(Date.now() - 10 * PERIOD_MS).toISOString(),
			updated_at: new Date().toISOString(),
		});

		// Counted while the old work is younger than the period: from then on the services' own
		// first prune (at a random moment of their first minute) may remove it before the test does.
		const oldIds = old.map(event => event.event_id!);
		const attemptsOfOld = () => db()("delivery_attempt_log as a").join("deliveries as d", "d.id", "a.delivery_id").whereIn("d.event_id", oldIds);
		expect((await attemptsOfOld().where({ "d.webhook_id": healthy.id })).length).toBe(2);
		// The second delivery's first attempt may still have been in flight when the webhook was disabled.
		const parkedAttempts = (await waitUntil(() => attemptsOfOld().where({ "d.webhook_id": parked.id }), rows => rows.length >= 2, "the parked deliveries' attempts")).length;

		await sleep(PERIOD_MS + 200);
		// Young work, published after the old work has aged past the period.
		const young = orderEvent(alice);
		await emit(young);
		await waitUntil(() => count("deliveries", { event_id: young.event_id, webhook_id: healthy.id, status: "succeeded" }), n => n === 1, "the young delivery");
		await waitUntil(() => count("email_outbox", { event_id: young.event_id, status: "sent" }), n => n === 1, "the young email");

		const dispatcherPruned = await env.stack.app.broker.call<Record<string, number>, object>("dispatcher.prune", {});
		const notifierPruned = await env.stack.app.broker.call<Record<string, number>, object>("notifier.prune", {});
		const webhooksPruned = await env.stack.app.broker.call<Record<string, number>, object>("webhooks.prune", {});
		// Counted over every run: the services' own schedule may have pruned some rows first.
		const prunedInAll = (table: string) => metricTotal(env.stack.app.broker, "retention_pruned_rows_total", { table });
		expect(dispatcherPruned).toHaveProperty("delivery_rejected_events");
		expect(notifierPruned).toHaveProperty("email_outbox");
		expect(webhooksPruned).toHaveProperty("webhooks_previous_secret");
		expect(await prunedInAll("delivery_rejected_events")).toBeGreaterThanOrEqual(1);
		expect(await prunedInAll("email_outbox")).toBeGreaterThanOrEqual(2);
		expect(await prunedInAll("webhooks_previous_secret")).toBeGreaterThanOrEqual(1);

		// Old and finished: gone, attempts with them. Old but pending: kept, with its message and attempts.
		expect(await count("deliveries", { webhook_id: healthy.id, event_id: old[0].event_id })).toBe(0);
		expect((await attemptsOfOld().where({ "d.webhook_id": healthy.id })).length).toBe(0);
		expect(await count("deliveries", { webhook_id: parked.id, status: "pending" })).toBe(2);
		expect((await attemptsOfOld().where({ "d.webhook_id": parked.id })).length).toBe(parkedAttempts);
		expect(await db()("delivery_messages").whereIn("event_id", oldIds).count({ count: "*" }).then(([row]) => Number(row.count))).toBe(2);
		const orphanAttempts = await db()("delivery_attempts").whereNotIn("delivery_id", db()("deliveries").select("id"));
		expect(orphanAttempts).toHaveLength(0);
		// Young: untouched.
		// (The parked webhook is disabled: the young event has one delivery.)
		expect(await count("deliveries", { event_id: young.event_id })).toBe(1);
		expect(await count("delivery_messages", { event_id: young.event_id })).toBe(1);
		expect(await count("email_outbox", { event_id: young.event_id })).toBe(1);
		// Emails: the old sent ones went, the pending one stays.
		expect(await count("email_outbox", { user_id: alice.userId, status: "sent" })).toBe(1);
		expect(await count("email_outbox", { id: pendingEmailId })).toBe(1);
		expect(await count("delivery_rejected_events")).toBe(0);
		// The rotation's previous secret is erased once its grace (1 s) is over.
		const row = await db()("webhooks").where({ id: healthy.id }).first();
		expect(row).toMatchObject({ previous_secret_envelope: null, previous_secret_expires_at: null });
		// The delivery log no longer lists what was pruned.
		const log = await env.stack.request("GET", `/id/v3/webhooks/${healthy.id}/deliveries`, { token: alice.token });
		expect(log.body.deliveries.map((delivery: { event_id: string }) => delivery.event_id)).toEqual([young.event_id]);

		// Once the parked deliveries finish (the webhook is re-enabled and answers), they go too.
		env.script(parked, [], { status: 200 });
		await env.stack.request("PATCH", `/id/v3/webhooks/${parked.id}`, { token: alice.token, body: { active: true } });
		await waitUntil(() => count("deliveries", { webhook_id: parked.id, status: "succeeded" }), n => n === 2, "the parked deliveries to be delivered");
		await env.stack.app.broker.call("dispatcher.prune", {});
		expect(await count("deliveries", { webhook_id: parked.id })).toBe(0);
		expect(await db()("delivery_messages").whereIn("event_id", oldIds).count({ count: "*" }).then(([row]) => Number(row.count))).toBe(0);
	});

	it("walks past pending work in small batches without deleting it", async () => {
		const bob = await newCustomer(env.stack, { signIn: true });
		const held = await env.createWebhook(bob.token);
		const done = await env.createWebhook(bob.token, { events: ["tasking:order_status"] });
		env.script(held, [], { status: 500 });
		const events = Array.from({ length: 7 }, () => orderEvent(bob));
		for (const event of events) await publish(event);
		await waitUntil(() => count("deliveries", { webhook_id: done.id, status: "succeeded" }), n => n === events.length, "the deliveries");
		await waitUntil(() => db()("deliveries").where({ webhook_id: held.id }).min({ attempts: "attempt_count" }), rows => Number(rows[0].attempts) >= 1, "first attempts");
		await env.stack.request("PATCH", `/id/v3/webhooks/${held.id}`, { token: bob.token, body: { active: false } });
		await waitUntil(() => count("deliveries", { webhook_id: held.id, parked: true }), n => n === events.length, "the held deliveries to be parked");

		// As if a period later, with batches of 2 messages, so pending work sits in front of every batch.
		const deleted = await runPruneJobs(db(), DISPATCHER_PRUNE_JOBS, { retentionMs: 0, batchSize: 2, pauseFactor: 0, now: new Date(Date.now() + 1_000) });
		expect(deleted.delivery_messages).toBeGreaterThanOrEqual(events.length);
		const eventIds = events.map(event => event.event_id!);
		expect(await db()("deliveries").whereIn("event_id", eventIds).where({ webhook_id: done.id }).count({ count: "*" }).then(([row]) => Number(row.count))).toBe(0);
		expect(await db()("deliveries").whereIn("event_id", eventIds).where({ webhook_id: held.id, status: "pending" }).count({ count: "*" }).then(([row]) => Number(row.count))).toBe(events.length);
		expect(await db()("delivery_messages").whereIn("event_id", eventIds).count({ count: "*" }).then(([row]) => Number(row.count))).toBe(events.length);
	});
});
