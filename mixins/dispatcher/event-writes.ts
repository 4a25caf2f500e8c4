// The dispatcher's hot intake write: the messages of a batch of events and their deliveries, on
// SQLite as one synchronous transaction of prepared single-row statements, on PostgreSQL as one
// prepared statement (one round trip) of column arrays. Ordering per order is decided here, in
// the same write: a delivery whose order's queue already has a head, or waiting rows, goes in as
// waiting. intake.mixin.ts plans the rows and leases; this file only writes them.
import type { Knex } from "knex";
import type { SqliteConnection } from "../../lib/sqlite-statements";
import { columnArrays, runPrepared, unnestColumns, type PreparedStatement } from "../../lib/pg-statements";
import { ORDER_HEAD_PREDICATE, distinctQueues, type OrderQueue } from "../../lib/order-queues";
import { promoteNextSqlite } from "./order-queues.mixin";
import type { MessageRow, NewDeliveryRow } from "./shared";

const MESSAGE_COLUMNS = ["event_id", "customer_id", "user_id", "type", "body", "occurred_at", "created_at", "trace_context"] as const satisfies ReadonlyArray<keyof MessageRow>;
const DELIVERY_COLUMNS = ["id", "event_id", "webhook_id", "customer_id", "status", "next_attempt_at", "lease_id", "order_key", "created_at", "updated_at"] as const satisfies ReadonlyArray<keyof NewDeliveryRow>;
const MESSAGE_VALUES = MESSAGE_COLUMNS.map(column => (row: MessageRow) => row[column]);
const DELIVERY_VALUES = DELIVERY_COLUMNS.map(column => (row: NewDeliveryRow) => row[column]);
// PostgreSQL's type of each column, for the unnest arrays: every id is uuid (migrations 016 and 017), the rest text.
const UUID_COLUMNS: ReadonlySet<string> = new Set(["id", "lease_id", "event_id", "webhook_id"]);
const typedColumns = (columns: readonly string[]) => columns.map(column => [column, UUID_COLUMNS.has(column) ? "uuid" : "text"] as const);
const MESSAGE_COLUMN_TYPES = typedColumns(MESSAGE_COLUMNS);
const DELIVERY_COLUMN_TYPES = typedColumns(DELIVERY_COLUMNS);

// A delivery whose order's queue already has a head goes in as waiting: out of the due index,
// without a lease, until the head ends (results.mixin.ts promotes the next one).
const AS_HEAD = `ON CONFLICT (webhook_id, order_key) WHERE ${ORDER_HEAD_PREDICATE} DO NOTHING`;

// So does one whose queue has waiting rows and no head, or it would overtake them. On PostgreSQL a
// queue is left so when its head's end was promoted without seeing a status committed beside it
// by another instance, until that instance's check after its commit (promoteHeadless), which
// runs after publish has answered, and never if the instance dies first (the cluster ordering
// tests met both). The check after the write promotes the earliest. `row` prefixes the new row's
// columns: "v." in a query, "@" for SQLite's parameters.
const queueHasNoWaiting = (row: string) =>
	`NOT EXISTS (SELECT 1 FROM deliveries q WHERE q.webhook_id = ${row}webhook_id AND q.order_key = ${row}order_key AND q.status = 'pending' AND q.waiting)`;

/** What an intake write answers: the event_ids that were new, the deliveries that went in as waiting, and how many queues it set going. */
export interface WrittenEvents {
	inserted: Set<string>;
	waiting: Set<string>;
	/** SQLite: waiting deliveries of queues without a head, promoted in the same transaction (PostgreSQL: promoteHeadless, after it). */
	promoted: number;
}

/**
 * SQLite, inside one transaction: one prepared single-row statement per row (cached by the
 * connection; cheaper here than multi-row statements); deliveries only for the new events.
 */
export function insertEventsSqlite(connection: SqliteConnection, messages: MessageRow[], deliveries: NewDeliveryRow[], now: string): WrittenEvents {
	const insertMessage = connection.prepare(
		`INSERT INTO delivery_messages (${MESSAGE_COLUMNS.join(", ")}) VALUES (${MESSAGE_COLUMNS.map(column => `@${column}`).join(", ")}) ON CONFLICT (event_id) DO NOTHING`,
	);
	const inserted = new Set<string>();
	for (const row of messages) if (insertMessage.run(row).changes === 1) inserted.add(row.event_id);
	const values = DELIVERY_COLUMNS.map(column => `@${column}`).join(", ");
	const insertDelivery = connection.prepare(`INSERT INTO deliveries (${DELIVERY_COLUMNS.join(", ")}) SELECT ${values} WHERE ${queueHasNoWaiting("@")} ${AS_HEAD}`);
	const insertWaiting = connection.prepare(`INSERT INTO deliveries (${DELIVERY_COLUMNS.join(", ")}, waiting) VALUES (${values}, 1)`);
	const waiting = new Set<string>();
	for (const row of deliveries) {
		if (!inserted.has(row.event_id) || insertDelivery.run(row).changes === 1) continue;
		insertWaiting.run({ ...row, next_attempt_at: null, lease_id: null });
		waiting.add(row.id);
	}
	// The single writer: a queue found without a head here is one nothing else is promoting.
	return { inserted, waiting, promoted: promoteNextSqlite(connection, queuesOf(deliveries, waiting), now) };
}

/**
 * PostgreSQL: the new messages and the deliveries of those in one statement (one round trip),
 * each column an array (uuid for the ids, text for the rest). Deliveries that meet their queue's head go
 * in as waiting, in the same statement: `waiting` reads what `d` left out. The head's insert
 * waits for a concurrent transaction that inserted a head of the same queue, then sees it.
 * Within a batch only the first delivery of a queue, by its place in the arrays (`ord`: the
 * events in occurrence order; `turn`, numbered by one sort per batch, not by comparing every row
 * with every other, which cost PostgreSQL 0.4 of its per-order throughput), may become the head: the order in which an INSERT … SELECT meets
 * its rows is the plan's (a hashed join shuffles them), and the PostgreSQL ordering benchmark
 * once had 240 of 2,000 statuses arrive out of order from a batch whose later status went first.
 */
const INSERT_EVENTS_POSTGRES: PreparedStatement = {
	name: "dispatcher_insert_events",
	text: `WITH m AS (
		INSERT INTO delivery_messages (${MESSAGE_COLUMNS.join(", ")})
		SELECT * FROM ${unnestColumns(MESSAGE_COLUMN_TYPES, 1, "v")}
		ON CONFLICT (event_id) DO NOTHING RETURNING event_id
	), v AS MATERIALIZED (
		SELECT u.*, ROW_NUMBER() OVER (PARTITION BY u.webhook_id, u.order_key ORDER BY u.ord) AS turn
		FROM ${unnestColumns(DELIVERY_COLUMN_TYPES, MESSAGE_COLUMNS.length + 1, "u", "ord")}
		WHERE u.event_id IN (SELECT event_id FROM m)
	), d AS (
		INSERT INTO deliveries (${DELIVERY_COLUMNS.join(", ")})
		SELECT ${DELIVERY_COLUMNS.map(column => `v.${column}`).join(", ")} FROM v
		WHERE v.order_key IS NULL OR (v.turn = 1 AND ${queueHasNoWaiting("v.")})
		${AS_HEAD}
		RETURNING id
	), w AS (
		INSERT INTO deliveries (${DELIVERY_COLUMNS.join(", ")}, waiting)
		SELECT ${DELIVERY_COLUMNS.map(column => (column === "next_attempt_at" || column === "lease_id" ? "NULL" : `v.${column}`)).join(", ")}, true
		FROM v WHERE v.order_key IS NOT NULL AND v.id NOT IN (SELECT id FROM d)
		RETURNING id
	)
	SELECT event_id, NULL AS waiting_id FROM m UNION ALL SELECT NULL, id FROM w`,
};

/** The order queues of the deliveries written as waiting. */
export function queuesOf(rows: NewDeliveryRow[], waiting: Set<string>): OrderQueue[] {
	const queued: OrderQueue[] = [];
	for (const row of rows) if (waiting.has(row.id) && row.order_key !== null) queued.push({ webhookId: row.webhook_id, orderKey: row.order_key });
	return distinctQueues(queued);
}

/** PostgreSQL: the batch's messages and deliveries in INSERT_EVENTS_POSTGRES, one round trip. */
export async function insertEventsPostgres(db: Knex, messages: MessageRow[], deliveries: NewDeliveryRow[]): Promise<WrittenEvents> {
	const values = [...columnArrays(messages, MESSAGE_VALUES), ...columnArrays(deliveries, DELIVERY_VALUES)];
	const written: WrittenEvents = { inserted: new Set(), waiting: new Set(), promoted: 0 };
	for (const row of await runPrepared<{ event_id: string | null; waiting_id: string | null }>(db, INSERT_EVENTS_POSTGRES, values)) {
		if (row.event_id !== null) written.inserted.add(row.event_id);
		else if (row.waiting_id !== null) written.waiting.add(row.waiting_id);
	}
	return written;
}
