// The dispatcher's tables: messages (one per event, the exact body bytes), deliveries (one per
// message and webhook, with the retry schedule and the lease), attempts (the delivery log) and
// rejected events (payloads that failed validation). Timestamps are ISO 8601 UTC text.
import type { Knex } from "knex";
import { isPostgres, type Migration } from "../mixins/db.mixin";
import { setColumnCollation } from "../lib/byte-order-columns";
import { moveImplicitCustomers, restoreImplicitCustomers } from "../lib/customers";
import { ORDER_HEAD_PREDICATE, orderHeadPredicate } from "../lib/order-queues";

// Every column that is joined or ordered on, together: a comparison between a "C" column and a
// default-collation one is an error in PostgreSQL.
const BYTE_ORDER_COLUMNS: Array<[table: string, columns: string[]]> = [
	["delivery_messages", ["event_id", "customer_id", "created_at"]],
	["deliveries", ["id", "event_id", "webhook_id", "customer_id", "next_attempt_at", "lease_id", "order_key", "created_at"]],
	["delivery_attempts", ["delivery_id"]],
	["delivery_rejected_events", ["received_at"]],
	["webhook_failures", ["webhook_id"]],
	["webhook_rate_slots", ["webhook_id"]],
];

// What a delivery's row keeps of its first attempt (014), as in delivery_attempts; the time is
// first_attempt_at, which was there before.
const FIRST_ATTEMPT_COLUMNS: Array<[column: string, type: string]> = [
	["success", "boolean"],
	["status_code", "integer"],
	["error_kind", "varchar(20)"],
	["title", "varchar(40)"],
	["detail", "varchar(500)"],
	["duration_ms", "integer"],
	["response_excerpt", "text"],
];

// The view of every attempt (014): a delivery's first from its own row, the later ones from
// delivery_attempts. Dropped and made again around a change of the columns it reads (016).
const CREATE_ATTEMPT_LOG_VIEW = `CREATE VIEW delivery_attempt_log AS
	SELECT id AS delivery_id, 1 AS attempt, first_attempt_at AS attempted_at, ${FIRST_ATTEMPT_COLUMNS.map(([column]) => `first_attempt_${column} AS ${column}`).join(", ")}
	FROM deliveries WHERE first_attempt_success IS NOT NULL
	UNION ALL
	SELECT delivery_id, attempt, attempted_at, ${FIRST_ATTEMPT_COLUMNS.map(([column]) => column).join(", ")}
	FROM delivery_attempts`;

// The ids the dispatcher makes for its own rows (016): a delivery's id (UUID version 7, lib/ids.ts),
// its lease's (crypto.randomUUID) and an attempt's delivery. The columns of other services' ids
// (event, webhook) join tables and messages that are not the dispatcher's alone, and stay text.
const OWN_UUID_COLUMNS: Array<[table: string, columns: string[]]> = [
	["deliveries", ["id", "lease_id"]],
	["delivery_attempts", ["delivery_id"]],
];
const ATTEMPTS_DELIVERY_FK = "delivery_attempts_delivery_id_foreign";

// The other services' ids in the dispatcher's tables (017): an event's (the producer's, which
// intake keeps in small letters, or one intake makes) and a webhook's. Every id any of these
// tables holds is a UUID: the API and intake take no other.
const OTHER_UUID_COLUMNS: Array<[table: string, columns: string[]]> = [
	["delivery_messages", ["event_id"]],
	["deliveries", ["event_id", "webhook_id"]],
	["webhook_failures", ["webhook_id"]],
	["webhook_rate_slots", ["webhook_id"]],
];
const DELIVERIES_MESSAGE_FK = "deliveries_event_id_foreign";
// What the ids were before they became uuid: 36 characters compared by bytes (013).
const ID_AS_TEXT = 'varchar(36) COLLATE "C"';

/** PostgreSQL: each listed column as `type` (one ALTER TABLE per table, so that its indexes are rebuilt once). */
async function setColumnTypes(db: Knex, columnsByTable: Array<[table: string, columns: string[]]>, type: string): Promise<void> {
	for (const [table, columns] of columnsByTable) {
		await db.raw(`ALTER TABLE ${table} ${columns.map(column => `ALTER COLUMN ${column} TYPE ${type} USING ${column}::${type}`).join(", ")}`);
	}
}

/** PostgreSQL: the columns of OWN_UUID_COLUMNS as `type`, with the view and the foreign key that read them made again. */
async function setOwnIdType(db: Knex, type: string): Promise<void> {
	await db.raw("DROP VIEW delivery_attempt_log");
	await db.raw(`ALTER TABLE delivery_attempts DROP CONSTRAINT ${ATTEMPTS_DELIVERY_FK}`);
	await setColumnTypes(db, OWN_UUID_COLUMNS, type);
	await db.raw(`ALTER TABLE delivery_attempts ADD CONSTRAINT ${ATTEMPTS_DELIVERY_FK} FOREIGN KEY (delivery_id) REFERENCES deliveries (id) ON DELETE CASCADE`);
	await db.raw(CREATE_ATTEMPT_LOG_VIEW);
}

/**
 * PostgreSQL: the columns of OTHER_UUID_COLUMNS as uuid or back as text, with the foreign key
 * from a delivery to its message and the promotion function (which takes webhook ids) made again.
 */
async function setOtherIdType(db: Knex, type: "uuid" | "text"): Promise<void> {
	await db.raw(`DROP FUNCTION dispatcher_promote_order_queues(${type === "uuid" ? "text" : "uuid"}[], text[], text)`);
	await db.raw(`ALTER TABLE deliveries DROP CONSTRAINT ${DELIVERIES_MESSAGE_FK}`);
	await setColumnTypes(db, OTHER_UUID_COLUMNS, type === "uuid" ? "uuid" : ID_AS_TEXT);
	await db.raw(`ALTER TABLE deliveries ADD CONSTRAINT ${DELIVERIES_MESSAGE_FK} FOREIGN KEY (event_id) REFERENCES delivery_messages (event_id)`);
	await createPromotionFunction(db, type);
}

/**
 * PostgreSQL (015, 017): the promotion of order queues' next deliveries as one function, taking the
 * webhook ids as `webhookIdType`, the type of deliveries.webhook_id (text until 017, then uuid).
 */
function createPromotionFunction(db: Knex, webhookIdType: "text" | "uuid") {
	return db.raw(`CREATE FUNCTION dispatcher_promote_order_queues(webhook_ids ${webhookIdType}[], order_keys text[], promoted_at text) RETURNS integer
		LANGUAGE plpgsql AS $body$
		DECLARE
			promoted integer;
		BEGIN
			PERFORM pg_advisory_xact_lock(k.key)
			FROM (SELECT DISTINCT hashtextextended(q.webhook_id || ':' || q.order_key, 0) AS key FROM unnest(webhook_ids, order_keys) AS q(webhook_id, order_key)) k
			ORDER BY k.key;
			WITH q AS (
				SELECT DISTINCT * FROM unnest(webhook_ids, order_keys) AS q(webhook_id, order_key)
			), next AS (
				SELECT DISTINCT ON (d.webhook_id, d.order_key) d.id, d.webhook_id, d.order_key
				FROM q JOIN deliveries d ON d.webhook_id = q.webhook_id AND d.order_key = q.order_key AND d.status = 'pending' AND d.waiting
				JOIN delivery_messages m ON m.event_id = d.event_id
				ORDER BY d.webhook_id, d.order_key, m.occurred_at, d.id
			)
			UPDATE deliveries SET waiting = false, next_attempt_at = promoted_at, updated_at = promoted_at
			FROM next WHERE deliveries.id = next.id
			AND NOT EXISTS (SELECT 1 FROM deliveries h WHERE h.webhook_id = next.webhook_id AND h.order_key = next.order_key AND ${orderHeadPredicate("h")});
			GET DIAGNOSTICS promoted = ROW_COUNT;
			RETURN promoted;
		END
		$body$`);
}

export const dispatcherMigrations: Migration[] = [
	{
		name: "001_create_delivery_tables",
		async up(db) {
			await db.schema.createTable("delivery_messages", table => {
				// The producer's event_id (or one we generated): a repeat of it is a no-op.
				table.string("event_id", 36).primary();
				table.string("customer_id", 200).notNullable();
				table.string("user_id", 200).notNullable();
				table.string("type", 100).notNullable();
				// The exact bytes every attempt sends and signs; never re-serialised.
				table.text("body").notNullable();
				table.string("occurred_at", 30).notNullable();
				table.string("created_at", 30).notNullable();
			});

			await db.schema.createTable("deliveries", table => {
				table.string("id", 36).primary();
				table.string("event_id", 36).notNullable().references("event_id").inTable("delivery_messages");
				table.string("webhook_id", 36).notNullable();
				table.string("customer_id", 200).notNullable();
				// pending | succeeded | failed | cancelled
				table.string("status", 16).notNullable();
				table.integer("attempt_count").notNullable().defaultTo(0);
				// When a pending delivery is due. While leased it holds the lease's expiry, so an
				// abandoned lease simply makes the row due again. NULL once final, or while parked.
				table.string("next_attempt_at", 30).nullable();
				// Which claim holds the row; result writes must match it, so a stale worker can't
				// overwrite a newer attempt.
				table.string("lease_id", 36).nullable();
				// Pending but held back because the webhook is disabled (not counted as an attempt).
				table.boolean("parked").notNullable().defaultTo(false);
				// A hand-triggered retry of a finished delivery: one attempt, no automatic retries.
				table.boolean("manual_retry").notNullable().defaultTo(false);
				table.string("first_attempt_at", 30).nullable();
				table.string("last_attempt_at", 30).nullable();
				table.integer("last_status_code").nullable();
				table.string("last_error_kind", 20).nullable();
				table.string("created_at", 30).notNullable();
				table.string("updated_at", 30).notNullable();
				table.unique(["event_id", "webhook_id"], { indexName: "deliveries_event_webhook_unique" });
				// The claim query: pending rows due by now, oldest first. Future rows sort after `now`,
				// so a million of them cost nothing to skip.
				table.index(["status", "next_attempt_at"], "deliveries_due_idx");
				// The delivery log (newest first per webhook) and cancelling a webhook's deliveries.
				table.index(["webhook_id", "created_at", "id"], "deliveries_webhook_log_idx");
				// The periodic re-check of parked deliveries.
				table.index(["parked", "webhook_id"], "deliveries_parked_idx");
			});

			await db.schema.createTable("delivery_attempts", table => {
				table.increments("id").primary();
				table.string("delivery_id", 36).notNullable().references("id").inTable("deliveries").onDelete("CASCADE");
				table.integer("attempt").notNullable();
				table.string("attempted_at", 30).notNullable();
				table.boolean("success").notNullable();
				table.integer("status_code").nullable();
				// http_status | timeout | unreachable | blocked
				table.string("error_kind", 20).nullable();
				table.string("title", 40).nullable();
				table.string("detail", 500).notNullable();
				table.integer("duration_ms").notNullable();
				// Kept for operators only; the API never returns it (that would make an SSRF oracle).
				table.text("response_excerpt").nullable();
				table.index(["delivery_id", "attempt"], "delivery_attempts_delivery_idx");
			});

			await db.schema.createTable("delivery_rejected_events", table => {
				table.increments("id").primary();
				// "event" (the tasking.order_status event) or "publish" (the dispatcher.publish action)
				table.string("source", 20).notNullable();
				table.string("event_id", 100).nullable();
				table.string("reason", 1000).notNullable();
				table.text("excerpt").notNullable();
				table.string("received_at", 30).notNullable();
				table.index(["received_at"], "delivery_rejected_events_received_idx");
			});
		},
		async down(db) {
			await db.schema.dropTable("delivery_rejected_events");
			await db.schema.dropTable("delivery_attempts");
			await db.schema.dropTable("deliveries");
			await db.schema.dropTable("delivery_messages");
		},
	},
	{
		name: "002_webhook_failures",
		async up(db) {
			// Webhooks whose attempts have all failed since `failing_since` (a success deletes the
			// row); `failed_messages` counts the messages whose first attempt failed in that time.
			await db.schema.createTable("webhook_failures", table => {
				table.string("webhook_id", 36).primary();
				table.string("failing_since", 30).notNullable();
				table.integer("failed_messages").notNullable().defaultTo(0);
				table.string("updated_at", 30).notNullable();
			});
			// Recover: a webhook's failed deliveries by time.
			await db.schema.alterTable("deliveries", table => {
				table.index(["webhook_id", "status", "created_at"], "deliveries_webhook_status_idx");
			});
		},
		async down(db) {
			await db.schema.alterTable("deliveries", table => table.dropIndex(["webhook_id", "status", "created_at"], "deliveries_webhook_status_idx"));
			await db.schema.dropTable("webhook_failures");
		},
	},
	{
		// Retention walks old messages by time (mixins/dispatcher/retention.ts).
		name: "003_messages_created_index",
		async up(db) {
			await db.schema.alterTable("delivery_messages", table => table.index(["created_at", "event_id"], "delivery_messages_created_idx"));
		},
		async down(db) {
			await db.schema.alterTable("delivery_messages", table => table.dropIndex(["created_at", "event_id"], "delivery_messages_created_idx"));
		},
	},
	{
		// Claims leave out the webhooks that already hold their share of leases (a slow or failing
		// receiver's retries, piling up as due rows). With webhook_id in the due index, skipping
		// those rows costs an index entry each instead of a table read: a pile of thousands made
		// every claim scan them, and claims took a quarter of the dispatcher's CPU.
		name: "004_due_index_covers_webhook",
		async up(db) {
			await db.schema.alterTable("deliveries", table => {
				table.index(["status", "next_attempt_at", "webhook_id"], "deliveries_due_webhook_idx");
			});
			await db.schema.alterTable("deliveries", table => {
				table.dropIndex(["status", "next_attempt_at"], "deliveries_due_idx");
			});
		},
		async down(db) {
			await db.schema.alterTable("deliveries", table => {
				table.index(["status", "next_attempt_at"], "deliveries_due_idx");
			});
			await db.schema.alterTable("deliveries", table => {
				table.dropIndex(["status", "next_attempt_at", "webhook_id"], "deliveries_due_webhook_idx");
			});
		},
	},
	{
		// Every delivery was in the due index (status, next_attempt_at, webhook_id) and in the parked
		// index (parked, webhook_id), though only pending rows are ever claimed and few are parked.
		// Each intake commit wrote a page of the parked index per webhook, and each result moved a
		// row from the 'pending' part of the due index to another. Partial indexes hold only the
		// rows that are looked for: in a replay of the dispatcher's writes (one event to 10
		// webhooks per transaction, results 100 at a time) SQLite's write cost per delivery fell
		// from 66-71 to 42-43 µs. Queries keep the predicates literal (status = 'pending', parked)
		// so that SQLite can prove a partial index applies; PostgreSQL plans with the values.
		name: "005_partial_due_and_parked_indexes",
		async up(db) {
			await db.raw("CREATE INDEX deliveries_pending_due_idx ON deliveries (next_attempt_at, webhook_id) WHERE status = 'pending'");
			await db.raw("DROP INDEX deliveries_due_webhook_idx");
			await db.raw("CREATE INDEX deliveries_parked_webhook_idx ON deliveries (webhook_id) WHERE parked");
			await db.raw("DROP INDEX deliveries_parked_idx");
		},
		async down(db) {
			await db.schema.alterTable("deliveries", table => {
				table.index(["status", "next_attempt_at", "webhook_id"], "deliveries_due_webhook_idx");
				table.index(["parked", "webhook_id"], "deliveries_parked_idx");
			});
			await db.raw("DROP INDEX deliveries_pending_due_idx");
			await db.raw("DROP INDEX deliveries_parked_webhook_idx");
		},
	},
	{
		// A webhook's own due rows, oldest first: the claim that refills a webhook whose rows wait
		// in the database (intake left them; see claimRefills) and the probe of an open breaker.
		// Through the due index, which is ordered by time over all webhooks, both read past every
		// other webhook's due rows: with a slow neighbour's pile of thousands, the failing
		// neighbour's probe grew from 3.5 to 12.7 ms of blocked event loop within 7 s.
		name: "006_pending_by_webhook_index",
		async up(db) {
			await db.raw("CREATE INDEX deliveries_pending_webhook_idx ON deliveries (webhook_id, next_attempt_at) WHERE status = 'pending'");
		},
		async down(db) {
			await db.raw("DROP INDEX deliveries_pending_webhook_idx");
		},
	},
	{
		// Users who are their own customer (no customer claim) now have the customer id "~<user id>",
		// apart from named customers (lib/customers.ts): their rows move to it.
		name: "007_implicit_customer_namespace",
		async up(db) {
			await moveImplicitCustomers(db, "delivery_messages");
			await moveImplicitCustomers(db, "deliveries");
		},
		async down(db) {
			await restoreImplicitCustomers(db, "delivery_messages");
			await restoreImplicitCustomers(db, "deliveries");
		},
	},
	{
		// Ordering per order (API.md): a webhook's deliveries of one tasking order form a queue,
		// order_key (the order_id; NULL for what is never ordered: test sends, notices, webhooks
		// with ordering "none", hand-made retries). Its head is the one pending row that is not
		// `waiting`; the others wait out of the due index (next_attempt_at NULL), so claims never
		// read them. The unique index makes "one head per queue" the database's rule, so two
		// instances taking in statuses of one order at once cannot both start one: the second
		// insert meets the first's head and goes in as waiting instead.
		name: "008_order_queues",
		async up(db) {
			await db.schema.alterTable("deliveries", table => {
				table.string("order_key", 200).nullable();
				table.boolean("waiting").notNullable().defaultTo(false);
			});
			await db.raw(`CREATE UNIQUE INDEX deliveries_order_head_idx ON deliveries (webhook_id, order_key) WHERE ${ORDER_HEAD_PREDICATE}`);
			// A queue's waiting rows, for the promotion of the next one and for waiting_for.
			await db.raw("CREATE INDEX deliveries_order_waiting_idx ON deliveries (webhook_id, order_key) WHERE status = 'pending' AND waiting");
		},
		async down(db) {
			await db.raw("DROP INDEX deliveries_order_waiting_idx");
			await db.raw("DROP INDEX deliveries_order_head_idx");
			await db.schema.alterTable("deliveries", table => {
				table.dropColumn("waiting");
				table.dropColumn("order_key");
			});
		},
	},
	{
		// The W3C traceparent of the event's trace (lib/tracing.ts), so that every attempt, however
		// long after the event, joins the event's trace. Null while tracing is off.
		name: "009_trace_context",
		async up(db) {
			await db.schema.alterTable("delivery_messages", table => {
				table.text("trace_context").nullable();
			});
		},
		async down(db) {
			await db.schema.alterTable("delivery_messages", table => {
				table.dropColumn("trace_context");
			});
		},
	},
	{
		// Rate limits (lib/rate-slots.ts): per limited webhook, the next free send time (epoch ms,
		// fractional: 10,000 a second are 0.1 ms apart), shared by every dispatcher instance.
		name: "010_webhook_rate_slots",
		async up(db) {
			await db.schema.createTable("webhook_rate_slots", table => {
				table.string("webhook_id", 36).primary();
				table.double("next_at").notNullable();
			});
		},
		async down(db) {
			await db.schema.dropTable("webhook_rate_slots");
		},
	},
	{
		// Recover reads a webhook's failed deliveries by time, and only those: the index of every
		// delivery by (webhook, status, time) took a new entry at each of a delivery's three writes
		// (intake, lease, result), since status and next_attempt_at keep every update from being
		// HOT. Kept to failed rows, it is written once per failed delivery. Replaying those writes
		// for 100,000 deliveries cost PostgreSQL 10 % less time without it (7.2 s against 6.5 s).
		name: "011_failed_deliveries_index",
		async up(db) {
			await db.raw("CREATE INDEX deliveries_failed_idx ON deliveries (webhook_id, created_at) WHERE status = 'failed'");
			await db.raw("DROP INDEX deliveries_webhook_status_idx");
		},
		async down(db) {
			await db.schema.alterTable("deliveries", table => table.index(["webhook_id", "status", "created_at"], "deliveries_webhook_status_idx"));
			await db.raw("DROP INDEX deliveries_failed_idx");
		},
	},
	{
		// A refill takes a webhook's oldest due rows in (next_attempt_at, id) order. With id outside
		// the pending-by-webhook index, PostgreSQL sorted what the index gave, and planned on young
		// statistics (one row expected) it read and sorted the webhook's whole due pile for each
		// refill of 64: 6,104 rows and 5 ms in a burst of 100,000, about 4,200 index entries and heap
		// tuples per refill, half the rows the cluster's PostgreSQL read per delivery. In this order
		// the index gives the rows already sorted, and the scan stops at the limit.
		name: "012_pending_by_webhook_in_claim_order",
		async up(db) {
			await db.raw("CREATE INDEX deliveries_pending_webhook_order_idx ON deliveries (webhook_id, next_attempt_at, id) WHERE status = 'pending'");
			await db.raw("DROP INDEX deliveries_pending_webhook_idx");
		},
		async down(db) {
			await db.raw("CREATE INDEX deliveries_pending_webhook_idx ON deliveries (webhook_id, next_attempt_at) WHERE status = 'pending'");
			await db.raw("DROP INDEX deliveries_pending_webhook_order_idx");
		},
	},
	{
		// PostgreSQL compared every id, key and timestamp in these indexes by the database's locale
		// (lib/byte-order-columns.ts says why bytes suffice and what else they buy). A delivery's
		// intake and result put about eight entries in indexes on such columns.
		name: "013_byte_order_keys",
		async up(db) {
			if (!isPostgres(db)) return;
			for (const [table, columns] of BYTE_ORDER_COLUMNS) await setColumnCollation(db, table, columns, "C");
		},
		async down(db) {
			if (!isPostgres(db)) return;
			for (const [table, columns] of BYTE_ORDER_COLUMNS) await setColumnCollation(db, table, columns, "default");
		},
	},
	{
		// Most deliveries are attempted once, and each first attempt was a row of delivery_attempts
		// with two index entries and a foreign key check. Now the update that records the result
		// writes it into the delivery's own row; attempts after it still get rows of their own.
		// Rows written before this keep their first attempt in delivery_attempts
		// (first_attempt_success is null there), so nothing is moved. delivery_attempt_log lists
		// both as one table, for operators and tests.
		name: "014_first_attempt_in_delivery",
		async up(db) {
			for (const [column, type] of FIRST_ATTEMPT_COLUMNS) await db.raw(`ALTER TABLE deliveries ADD COLUMN first_attempt_${column} ${type}`);
			await db.raw(CREATE_ATTEMPT_LOG_VIEW);
		},
		async down(db) {
			await db.raw("DROP VIEW delivery_attempt_log");
			const columns = FIRST_ATTEMPT_COLUMNS.map(([column]) => column);
			await db.raw(`INSERT INTO delivery_attempts (delivery_id, attempt, attempted_at, ${columns.join(", ")})
				SELECT id, 1, first_attempt_at, ${columns.map(column => `first_attempt_${column}`).join(", ")}
				FROM deliveries WHERE first_attempt_success IS NOT NULL`);
			for (const column of columns) await db.raw(`ALTER TABLE deliveries DROP COLUMN first_attempt_${column}`);
		},
	},
	{
		// The promotion of order queues' next deliveries on PostgreSQL, as one call: a
		// transaction-scoped lock per queue, taken in one order, then the promotion under them. Each
		// statement of a PL/pgSQL function takes a fresh snapshot, so the promotion reads after the
		// locks are held, as the lock and promotion statements did inside a transaction of their own
		// (order-queues.mixin.ts says what the locks are for). A batch of ordered results took five
		// round trips (BEGIN, the write, the locks, the promotion, COMMIT), and each cost the
		// dispatcher's main thread and PostgreSQL a wake-up; it now takes two.
		name: "015_order_queue_promotion_function",
		async up(db) {
			if (!isPostgres(db)) return;
			await createPromotionFunction(db, "text");
		},
		async down(db) {
			if (!isPostgres(db)) return;
			await db.raw("DROP FUNCTION dispatcher_promote_order_queues(text[], text[], text)");
		},
	},
	{
		// PostgreSQL kept the dispatcher's own ids as 36 characters of text in every index they are
		// in (the primary key, the delivery log's and the pending-by-webhook one) and compared them
		// as text. As uuid they are 16 bytes compared as such: in a replay of intake and result
		// writes (docs/benchmarks.md, 2026-11-28 16:13–17:45) PostgreSQL spent about 12 % less CPU and wrote
		// 9 % less WAL per delivery. The API takes these ids only as UUIDs (lib/schemas), and uuid
		// order is the text's order, so the delivery log and claims order rows as before. SQLite
		// keeps text.
		name: "016_uuid_own_ids",
		async up(db) {
			if (isPostgres(db)) await setOwnIdType(db, "uuid");
		},
		async down(db) {
			if (isPostgres(db)) await setOwnIdType(db, ID_AS_TEXT);
		},
	},
	{
		// The event's and the webhook's ids were still 36 characters of text, in the deliveries'
		// unique (event, webhook) index, the delivery log's, the due, pending-by-webhook, failed
		// and order-head ones, and the messages' primary key. As uuid, PostgreSQL wrote 16 % less
		// WAL per delivery in the service's bursts (docs/benchmarks.md, 2026-12-01 20:10) and spent
		// about 8 % less CPU in a replay of intake and result writes (2026-11-28 16:13). An event id
		// reaches the table in small letters (intake), as a uuid column hands it back; webhook ids
		// are the webhooks service's, made in small letters. SQLite keeps text.
		name: "017_uuid_event_and_webhook_ids",
		async up(db) {
			if (isPostgres(db)) await setOtherIdType(db, "uuid");
		},
		async down(db) {
			if (isPostgres(db)) await setOtherIdType(db, "text");
		},
	},
];
