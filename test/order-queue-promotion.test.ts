// The promotion of an order queue's next delivery on PostgreSQL (migration 015's function, which
// promoteNextPostgres calls after a result batch, after intake's waiting rows and in the sweep).
// It must read the queue only once it holds the queue's lock: a waiting row committed by a writer
// that held the lock is then seen, not missed. That is what closes the race between a head ending
// in one instance and a later status written as waiting in another (order-queues.mixin.ts). And
// two promotions of one queue at once set one delivery going, the earliest waiting one.
import knex, { type Knex } from "knex";
import { runMigrations } from "../mixins/db.mixin";
import { dispatcherMigrations } from "../migrations/dispatcher";
import { promoteNextPostgres } from "../mixins/dispatcher/order-queues.mixin";
import { scratchDatabase, type ScratchDatabase } from "./helpers/scratch-database";
import { waitUntil } from "./helpers/delivery-stack";
import { TEST_DATABASE_URL } from "./helpers/services";

const describeOnPostgres = process.env.TEST_POSTGRES === "yes" ? describe : describe.skip;

describeOnPostgres("the promotion of an order queue's next delivery on PostgreSQL", () => {
	let scratch: ScratchDatabase;
	// Its own connection: the scratch pool's two are the writer's and the promotion's.
	let observer: Knex;
	const webhookId = "0193a1b2-0000-7000-8000-00000000c0de";
	const at = (second: number) => new Date(Date.UTC(2026, 10, 28, 5, 0, second)).toISOString();
	let rows = 0;

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
		rows += 1;
		const eventId = `evt-${orderKey}-${rows}`;
		const id = `dlv-${orderKey}-${rows}`;
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
					`SELECT count(*) AS n FROM pg_locks l, (SELECT hashtextextended(? || ':' || ?, 0) AS k) q
					WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objsubid = 1 AND l.classid = ((q.k >> 32) & 4294967295)::oid AND l.objid = (q.k & 4294967295)::oid`,
					[webhookId, orderKey],
				)
			).rows[0].n,
		);

	it("waits for a writer holding the queue's lock, then sees the row it committed", async () => {
		await status(scratch.db, "order-a", 1, "ended");
		const writer = await scratch.db.transaction();
		await writer.raw("SELECT pg_advisory_xact_lock(hashtextextended(? || ':' || ?, 0))", [webhookId, "order-a"]);
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
