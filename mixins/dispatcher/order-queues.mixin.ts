// Dispatcher order queues (API.md, "Ordering per order"). For a webhook ordered per order, the
// deliveries of one tasking order form a queue (deliveries.order_key): its head is the one
// pending row that is not `waiting`, and the others wait out of the due index, so that claims
// never read them. Intake writes a delivery as the head, or as waiting when its queue has one
// (intake.mixin.ts). Here:
//   - promotion: when a head ends (succeeded, failed, cancelled), the next status of its order,
//     by occurred_at then intake order, becomes due at once, in the transaction of the result;
//   - the safety net: queues left with waiting rows and no head (see sweepHeadlessQueues);
//   - a webhook switched to ordering "none": its waiting deliveries go at once;
//   - waiting_for: what a waiting delivery waits for, for the delivery log.
// A delivery leaves its queue (order_key NULL) when it is retried by hand or recovered: the
// customer asked for it now.
import type { Knex } from "knex";
import type { Context } from "moleculer";
import { isPostgres, nowIso } from "../db.mixin";
import { inSqliteTransaction, type SqliteConnection } from "../../lib/sqlite-statements";
import { runPrepared, unnestColumns, type PreparedStatement } from "../../lib/pg-statements";
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

/** Whether a batch may end a head, so that its write must promote in the same transaction. */
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
// writers), before the promotion reads. Intake's check after writing waiting rows takes the same
// locks (promoteHeadless): without them, a waiting row committed by another instance between this
// statement's snapshot and this commit would be left with no head to end and promote it.
const LOCK_QUEUES_POSTGRES: PreparedStatement = {
	name: "dispatcher_lock_order_queues",
	text: `SELECT pg_advisory_xact_lock(k.key)
		FROM (SELECT DISTINCT hashtextextended(q.webhook_id || ':' || q.order_key, 0) AS key FROM ${unnestColumns([["webhook_id", "text"], ["order_key", "text"]], 1, "q")}) k
		ORDER BY k.key`,
};

const PROMOTE_POSTGRES: PreparedStatement = {
	name: "dispatcher_promote_order_queues",
	text: `WITH q AS (
		SELECT DISTINCT * FROM ${unnestColumns([["webhook_id", "text"], ["order_key", "text"]], 1, "q")}
	), next AS (
		SELECT DISTINCT ON (d.webhook_id, d.order_key) d.id, d.webhook_id, d.order_key
		FROM q JOIN deliveries d ON d.webhook_id = q.webhook_id AND d.order_key = q.order_key AND d.status = 'pending' AND d.waiting
		JOIN delivery_messages m ON m.event_id = d.event_id
		ORDER BY d.webhook_id, d.order_key, m.occurred_at, d.id
	)
	UPDATE deliveries SET waiting = false, next_attempt_at = $3::text, updated_at = $3::text
	FROM next WHERE deliveries.id = next.id
	AND NOT EXISTS (SELECT 1 FROM deliveries h WHERE h.webhook_id = next.webhook_id AND h.order_key = next.order_key AND ${orderHeadPredicate("h")})
	RETURNING deliveries.id`,
};

/** PostgreSQL, inside the caller's transaction: locks the queues, then promotes. Returns how many were promoted. */
export async function promoteNextPostgres(trx: Knex, queues: OrderQueue[], now: string): Promise<number> {
	if (queues.length === 0) return 0;
	const columns = [queues.map(queue => queue.webhookId), queues.map(queue => queue.orderKey)];
	await runPrepared(trx, LOCK_QUEUES_POSTGRES, columns);
	return (await runPrepared(trx, PROMOTE_POSTGRES, [...columns, now])).length;
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
		 * After intake wrote waiting rows: their queues' heads may have ended meanwhile, in another
		 * instance whose promotion could not see them yet (PostgreSQL only; see LOCK_QUEUES_POSTGRES).
		 */
		async promoteHeadless(this: DispatcherThis, queues: OrderQueue[]): Promise<void> {
			if (queues.length === 0 || !isPostgres(this.db)) return;
			try {
				const promoted = await this.db.transaction(trx => promoteNextPostgres(trx, queues, nowIso()));
				if (promoted > 0) this.requestClaim();
			} catch (err) {
				// The sweep finds such a queue later.
				this.logger.warn(`Checking ${queues.length} order queues after intake failed: ${(err as Error).message}`);
			}
		},

		/**
		 * The safety net, at a slow cadence: queues with waiting rows and no head. A result, its
		 * promotion and intake's check after it are each atomic, but an instance killed between
		 * intake's commit and its check can leave one.
		 */
		async sweepHeadlessQueues(this: DispatcherThis): Promise<void> {
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
					? await this.db.transaction(trx => promoteNextPostgres(trx, queues, now))
					: await inSqliteTransaction(this.db, connection => promoteNextSqlite(connection, queues, now));
				if (promoted > 0) {
					this.logger.warn(`${rows.length} order queues had waiting deliveries and no head; their next ones were set going`);
					this.requestClaim();
				}
			} catch (err) {
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
