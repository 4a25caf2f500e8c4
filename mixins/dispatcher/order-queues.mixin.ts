// Dispatcher order queues (API.md, "Ordering per order"). For a webhook ordered per order, the
// deliveries of one tasking order form a queue (deliveries.order_key): its head is the one
// pending row that is not `waiting`, and the others wait out of the due index, so that claims
// never read them. Intake writes a delivery as the head, or as waiting when its queue has one
// (intake.mixin.ts). Here:
//   - promotion: when a head ends (succeeded, failed, cancelled), the next status of its order,
//     by occurred_at then intake order, becomes due at once: in the transaction of the result on
//     SQLite, in one statement right after its commit on PostgreSQL;
//   - the safety net: queues left with waiting rows and no head (see sweepHeadlessQueues);
//   - a webhook switched to ordering "none": its waiting deliveries go at once;
//   - waiting_for: what a waiting delivery waits for, for the delivery log.
// A delivery leaves its queue (order_key NULL) when it is retried by hand or recovered: the
// customer asked for it now.
import type { Knex } from "knex";
import type { Context } from "moleculer";
import { isPostgres, nowIso } from "../db.mixin";
import { inSqliteTransaction, type SqliteConnection } from "../../lib/sqlite-statements";
import { arrayLiteral, runPrepared, type PreparedStatement } from "../../lib/pg-statements";
import { ORDER_HEAD_PREDICATE, distinctQueues, orderHeadPredicate, queueKey, type OrderQueue } from "../../lib/order-queues";
import { WEBHOOK_EVENTS, type WebhookChangedEvent } from "../../lib/schemas/webhooks";
import type { DeliveryRow, DeliveryUpdate, DispatcherMixin, DispatcherThis } from "./shared";

export type { OrderQueue };

// Waiting rows looked at per sweep for a queue without a head; the next sweep takes the rest.
const SWEEP_LIMIT = 500;

/** The queues whose head a batch of results ended: the deliveries written that were ordered and are now final. */
export function endedQueues(updates: DeliveryUpdate[], matched: Set<string>): OrderQueue[] {
	const ended: OrderQueue[] = [];
	for (const { delivery, status } of updates) {
		if (status !== "pending" && delivery.orderKey !== null && matched.has(delivery.id)) ended.push({ webhookId: delivery.webhookId, orderKey: delivery.orderKey });
	}
	return distinctQueues(ended);
}

/** Whether a batch may end a head, so that its write must be followed by a promotion (in its transaction on SQLite). */
export const mayEndHeads = (updates: DeliveryUpdate[]) => updates.some(({ delivery, status }) => status !== "pending" && delivery.orderKey !== null);

// The next of a queue: its earliest waiting row by occurred_at, then by id (time-ordered: intake
// order), set due now, unless the queue has a head already (a manual retry cannot make one, but a
// sweep and a result may meet). The waiting index finds a queue's waiting rows.
const PROMOTE_SQLITE = `UPDATE deliveries SET waiting = 0, next_attempt_at = @now, updated_at = @now
	WHERE id = (
		SELECT d.id FROM deliveries d JOIN delivery_messages m ON m.event_id = d.event_id
		WHERE d.webhook_id = @webhook_id AND d.order_key = @order_key AND d.status = 'pending' AND d.waiting
		ORDER BY m.occurred_at, d.id LIMIT 1
	)
	AND NOT EXISTS (SELECT 1 FROM deliveries h WHERE h.webhook_id = @webhook_id AND h.order_key = @order_key AND ${orderHeadPredicate("h")})`;

/** SQLite, inside the caller's transaction (the single writer: nothing can race it). Returns how many were promoted. */
export function promoteNextSqlite(connection: SqliteConnection, queues: OrderQueue[], now: string): number {
	if (queues.length === 0) return 0;
	const promote = connection.prepare(PROMOTE_SQLITE);
	let promoted = 0;
	for (const { webhookId, orderKey } of queues) promoted += promote.run({ webhook_id: webhookId, order_key: orderKey, now }).changes;
	return promoted;
}

// PostgreSQL: a transaction-scoped lock per queue, taken in one order (no deadlock between two
// writers), before the promotion reads: migration 015's function takes the locks, then promotes
// under them, in one round trip. Every promotion goes through it: after a result batch that ended
// heads has committed, after intake wrote waiting rows (promoteHeadless), and in the sweep. The
// locks make the promotions of one queue take turns, each reading what the one before committed:
// two that read a queue as headless at once would both set its earliest waiting delivery going,
// the second perhaps after a claim had leased it. Before migration 015 the promotion ran inside the
// result's transaction, so it could also miss a waiting row that another instance committed
// meanwhile; instances of that code still take the same locks.
const PROMOTE_POSTGRES: PreparedStatement = {
	name: "dispatcher_promote_order_queues",
	// Webhook ids are uuid since migration 017.
	text: "SELECT dispatcher_promote_order_queues($1::uuid[], $2::text[], $3::text) AS promoted",
};

/** PostgreSQL: locks the queues, then promotes, in one statement of its own. Returns how many were promoted. */
export async function promoteNextPostgres(db: Knex, queues: OrderQueue[], now: string): Promise<number> {
	if (queues.length === 0) return 0;
	const [row] = await runPrepared<{ promoted: number }>(db, PROMOTE_POSTGRES, [arrayLiteral(queues.map(queue => queue.webhookId)), arrayLiteral(queues.map(queue => queue.orderKey)), now]);
	return row.promoted;
}

export const OrderQueuesMixin: DispatcherMixin = {
	events: {
		[WEBHOOK_EVENTS.updated]: {
			async handler(this: DispatcherThis, ctx: Context<Partial<WebhookChangedEvent>>) {
				const { id, ordering } = ctx.params ?? {};
				if (typeof id !== "string" || ordering !== "none") return;
				try {
					await this.releaseOrderQueues(id);
				} catch (err) {
					this.logger.error(`Could not release the order queues of webhook ${id}`, err);
				}
			},
		},
	},

	methods: {
		/**
		 * Ordering switched to "none": every queued delivery of the webhook leaves its queue, and
		 * those waiting are due now. While the webhook is disabled the worker parks them when it
		 * takes them, without an attempt, as it does any delivery of a disabled webhook.
		 */
		async releaseOrderQueues(this: DispatcherThis, webhookId: string): Promise<number> {
			const now = nowIso();
			const released = await this.db("deliveries")
				.where({ webhook_id: webhookId, status: "pending" })
				.whereNotNull("order_key")
				.update({
					order_key: null,
					next_attempt_at: this.db.raw("CASE WHEN waiting THEN ? ELSE next_attempt_at END", [now]),
					waiting: false,
					updated_at: now,
				});
			if (released > 0) {
				this.logger.info(`Webhook ${webhookId} is no longer ordered per order: ${released} queued deliveries released`);
				this.requestClaim();
			}
			return released;
		},

		/**
		 * PostgreSQL, queues that may have been left without a head: after a result batch ended
		 * their heads, or after intake wrote waiting rows to them (their heads may have ended
		 * meanwhile, in another instance whose promotion could not see those rows yet). Each call
		 * is atomic; one that fails leaves the queue to the next poll's sweep, an instance that dies
		 * before it to the regular sweep (of whichever instance polls).
		 */
		async promoteHeadless(this: DispatcherThis, queues: OrderQueue[]): Promise<void> {
			if (queues.length === 0 || !isPostgres(this.db)) return;
			try {
				const promoted = await promoteNextPostgres(this.db, queues, nowIso());
				if (promoted > 0) this.requestClaim();
			} catch (err) {
				this.headlessSweepDue = true;
				this.logger.warn(`Promoting the next deliveries of ${queues.length} order queues failed, the next poll's sweep will: ${(err as Error).message}`);
			}
		},

		/**
		 * The safety net, at a slow cadence: queues with waiting rows and no head. On PostgreSQL a
		 * result batch and intake each commit before the promotion after them (promoteHeadless), so
		 * an instance killed in between, or a promotion that failed, can leave one.
		 */
		async sweepHeadlessQueues(this: DispatcherThis): Promise<void> {
			this.headlessSweepDue = false;
			try {
				const rows: Array<{ webhook_id: string; order_key: string }> = await this.db("deliveries as w")
					.distinct("w.webhook_id", "w.order_key")
					.whereRaw("w.status = 'pending' AND w.waiting")
					.whereNotExists(function headOf() {
						this.select(1)
							.from("deliveries as h")
							.whereRaw("h.webhook_id = w.webhook_id AND h.order_key = w.order_key")
							.andWhereRaw(`${orderHeadPredicate("h")}`);
					})
					.limit(SWEEP_LIMIT);
				if (rows.length === 0) return;
				const queues = rows.map(row => ({ webhookId: row.webhook_id, orderKey: row.order_key }));
				const now = nowIso();
				const promoted = isPostgres(this.db)
					? await promoteNextPostgres(this.db, queues, now)
					: await inSqliteTransaction(this.db, connection => promoteNextSqlite(connection, queues, now));
				if (promoted > 0) {
					this.logger.warn(`${rows.length} order queues had waiting deliveries and no head; their next ones were set going`);
					this.requestClaim();
				}
			} catch (err) {
				this.headlessSweepDue = true;
				this.logger.warn(`Checking the order queues failed, will try again: ${(err as Error).message}`);
			}
		},

		/** For the delivery log: each waiting row's queue head, the delivery it waits for. */
		async waitingForOf(this: DispatcherThis, rows: DeliveryRow[]): Promise<Map<string, string>> {
			const waiting = rows.filter(row => row.status === "pending" && Boolean(row.waiting) && row.order_key !== null);
			const waitsFor = new Map<string, string>();
			if (waiting.length === 0) return waitsFor;
			const heads: Array<{ id: string; webhook_id: string; order_key: string }> = await this.db("deliveries")
				.select("id", "webhook_id", "order_key")
				.whereIn(
					["webhook_id", "order_key"],
					distinctQueues(waiting.map(row => ({ webhookId: row.webhook_id, orderKey: row.order_key! }))).map(queue => [queue.webhookId, queue.orderKey]),
				)
				.andWhereRaw(ORDER_HEAD_PREDICATE);
			const headOf = new Map(heads.map(head => [queueKey(head.webhook_id, head.order_key), head.id]));
			for (const row of waiting) {
				const head = headOf.get(queueKey(row.webhook_id, row.order_key!));
				if (head) waitsFor.set(row.id, head);
			}
			return waitsFor;
		},
	},
};
