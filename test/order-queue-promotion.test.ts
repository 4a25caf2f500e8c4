// The promotion of an order queue's next delivery on PostgreSQL (migration 015's function, which
// promoteNextPostgres calls after a result batch, after intake's waiting rows and in the sweep).
// It must read the queue only once it holds the queue's lock: what a writer that held the lock
// committed is then seen, not missed, so the promotions of one queue take turns
// (order-queues.mixin.ts says why). And two promotions of one queue at once set one delivery
// going, the earliest waiting one. A promotion that fails (the results are already committed) is
// retried by the next poll's sweep, not left to the sweep that comes every PARKED_RECHECK_POLLS polls.
import crypto from "node:crypto";
import knex, { type Knex } from "knex";
import { runMigrations } from "../mixins/db.mixin";
import { dispatcherMigrations } from "../migrations/dispatcher";
import { promoteNextPostgres } from "../mixins/dispatcher/order-queues.mixin";
import { timeOrderedUuid } from "../lib/ids";
import { scratchDatabase, type ScratchDatabase } from "./helpers/scratch-database";
import { newCustomer, orderEvent, startDeliveryStack, verified, waitUntil, type DeliveryStack } from "./helpers/delivery-stack";
import { PARKED_RECHECK_POLLS, type DispatcherThis } from "../mixins/dispatcher/shared";
import { describeWhere, TEST_DATABASE_URL } from "./helpers/services";

const describeOnPostgres = describeWhere({ postgres: true });
// A queue's advisory lock key, as migration 015's function computes it, for (webhook id, order key).
const QUEUE_LOCK_KEY = "hashtextextended(? || ':' || ?, 0)";

describeOnPostgres("the promotion of an order queue's next delivery on PostgreSQL", () => {
	let scratch: ScratchDatabase;
	// Its own connection: the scratch pool's two are the writer's and the promotion's.
	let observer: Knex;
	const webhookId = "0193a1b2-0000-7000-8000-00000000c0de";
	const at = (second: number) => new Date(Date.UTC(2026, 10, 28, 5, 0, second)).toISOString();

	beforeAll(async () => {
		scratch = await scratchDatabase("postgres", "promotion");
		await runMigrations(scratch.db, "dispatcher", dispatcherMigrations);
		observer = knex({ client: "pg", connection: TEST_DATABASE_URL, pool: { min: 0, max: 1 } });
	});
	afterAll(async () => {
		await observer?.destroy();
		await scratch?.drop();
	});

	/** A status of an order and its delivery, as intake writes them: the head, waiting, or ended. */
	async function status(db: typeof scratch.db, orderKey: string, second: number, state: "ended" | "head" | "waiting"): Promise<string> {
		// Every id is uuid on PostgreSQL (migrations 016 and 017).
		const eventId = crypto.randomUUID();
		const id = timeOrderedUuid();
		await db("delivery_messages").insert({ event_id: eventId, customer_id: "cus", user_id: "usr", type: "tasking.order_status", body: "{}", occurred_at: at(second), created_at: at(second) });
		await db("deliveries").insert({
			id,
			event_id: eventId,
			webhook_id: webhookId,
			customer_id: "cus",
			status: state === "ended" ? "succeeded" : "pending",
			waiting: state === "waiting",
			next_attempt_at: state === "head" ? at(second) : null,
			order_key: orderKey,
			created_at: at(second),
			updated_at: at(second),
		});
		return id;
	}
	const rowOf = (id: string) => scratch.db("deliveries").where({ id }).first();
	/** Sessions waiting for a queue's lock (an advisory lock's 64-bit key is split over classid and objid). */
	const waitersFor = async (orderKey: string) =>
		Number(
			(
				await observer.raw(
					`SELECT count(*) AS n FROM pg_locks l, (SELECT ${QUEUE_LOCK_KEY} AS k) q
					WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objsubid = 1 AND l.classid = ((q.k >> 32) & 4294967295)::oid AND l.objid = (q.k & 4294967295)::oid`,
					[webhookId, orderKey],
				)
			).rows[0].n,
		);

	it("waits for a writer holding the queue's lock, then sees the row it committed", async () => {
		await status(scratch.db, "order-a", 1, "ended");
		const writer = await scratch.db.transaction();
		await writer.raw(`SELECT pg_advisory_xact_lock(${QUEUE_LOCK_KEY})`, [webhookId, "order-a"]);
		const next = await status(writer, "order-a", 2, "waiting");

		const promotedAt = at(30);
		const promotion = promoteNextPostgres(scratch.db, [{ webhookId, orderKey: "order-a" }], promotedAt);
		await waitUntil(() => waitersFor("order-a"), waiters => waiters === 1, "the promotion to wait for the queue's lock");
		await writer.commit();

		expect(await promotion).toBe(1);
		expect(await rowOf(next)).toMatchObject({ status: "pending", waiting: false, next_attempt_at: promotedAt });
	});

	it("leaves a queue that has a head alone", async () => {
		await status(scratch.db, "order-b", 1, "head");
		const waiting = await status(scratch.db, "order-b", 2, "waiting");
		expect(await promoteNextPostgres(scratch.db, [{ webhookId, orderKey: "order-b" }], at(30))).toBe(0);
		expect(await rowOf(waiting)).toMatchObject({ waiting: true, next_attempt_at: null });
	});

	it("two promotions of one headless queue at once set one delivery going, the earliest by occurred_at", async () => {
		await status(scratch.db, "order-c", 1, "ended");
		// Written out of order: the later status first.
		const later = await status(scratch.db, "order-c", 3, "waiting");
		const earlier = await status(scratch.db, "order-c", 2, "waiting");
		const queue = [{ webhookId, orderKey: "order-c" }];
		const promoted = await Promise.all([promoteNextPostgres(scratch.db, queue, at(30)), promoteNextPostgres(scratch.db, queue, at(31))]);
		expect(promoted.reduce((sum, count) => sum + count, 0)).toBe(1);
		expect(await rowOf(earlier)).toMatchObject({ waiting: false });
		expect(await rowOf(later)).toMatchObject({ waiting: true, next_attempt_at: null });
	});
});

describeOnPostgres("a dispatcher whose promotion failed, on PostgreSQL", () => {
	let env: DeliveryStack;
	beforeAll(async () => {
		env = await startDeliveryStack("postgres", { env: { DELIVERY_POLL_INTERVAL: "100ms" } });
	});
	afterAll(() => env?.stop());

	it("sweeps at its next poll once the promotion works again, not at the next regular sweep", async () => {
		const db = env.stack.db;
		const dispatcher = () => env.stack.app.broker.getLocalService("dispatcher") as unknown as DispatcherThis;
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const order = `order-promotion-fails-${Date.now()}`;
		const base = Date.parse("2026-07-01T00:00:00Z");
		const [h1, h2] = ["H1", "H2"].map((label, step) => orderEvent(alice, { order_id: order, order_name: label, status: "staged", occurred_at: new Date(base + step * 1_000).toISOString() }));
		const rowOf = (eventId: string) => db("deliveries").where({ event_id: eventId, webhook_id: webhook.id }).first();

		// The promotion fails as a lost connection or a failover would make it fail.
		const signature = "dispatcher_promote_order_queues(uuid[], text[], text)";
		const realDefinition: string = (await db.raw(`SELECT pg_get_functiondef(to_regprocedure(?)) AS definition`, [signature])).rows[0].definition;
		await db.raw(`CREATE OR REPLACE FUNCTION dispatcher_promote_order_queues(webhook_ids uuid[], order_keys text[], promoted_at text) RETURNS integer
			LANGUAGE plpgsql AS $body$ BEGIN RAISE EXCEPTION 'promotion unavailable'; END $body$`);
		await env.stack.app.broker.call("dispatcher.publish", h1);
		await env.stack.app.broker.call("dispatcher.publish", h2);
		await waitUntil(() => rowOf(h1.event_id!), row => row?.status === "succeeded", "H1 to be delivered");
		const failedAt = dispatcher().polls;
		await waitUntil(() => dispatcher().polls, polls => polls >= failedAt + 3, "three polls");
		expect(Boolean((await rowOf(h2.event_id!)).waiting)).toBe(true);

		// Working again, well before the next regular sweep.
		await waitUntil(() => dispatcher().polls % PARKED_RECHECK_POLLS, sincePrevious => sincePrevious >= 1 && sincePrevious <= 5, "a poll just past a regular sweep");
		const restoredAt = dispatcher().polls;
		const nextRegularSweep = (Math.floor(restoredAt / PARKED_RECHECK_POLLS) + 1) * PARKED_RECHECK_POLLS;
		await db.raw(realDefinition);
		await waitUntil(() => rowOf(h2.event_id!), row => !row.waiting, "H2 to be promoted");
		expect(dispatcher().polls).toBeLessThan(nextRegularSweep);
		await waitUntil(() => rowOf(h2.event_id!), row => row.status === "succeeded", "H2 to be delivered");
		expect(env.received(webhook).map(request => verified(request, webhook.secret).data.order_name)).toEqual(["H1", "H2"]);
	});
});
