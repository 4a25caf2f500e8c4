// The dispatcher's migrations on PostgreSQL.
// Several instances of one service starting at the same moment on a fresh PostgreSQL schema
// (a cluster's dispatchers, `docker compose up --scale dispatcher=3`) must all start: the
// cluster fault tests saw the second dispatcher die on knex's own migrations table, created
// twice at once. Each instance here has its own knex pool, as separate processes do.
// And every text column an index of the dispatcher's orders by compares bytes ("C" collation),
// whatever the database's locale (migration 013, lib/byte-order-columns.ts).
import crypto from "node:crypto";
import knex, { type Knex } from "knex";
import { runMigrations } from "../mixins/db.mixin";
import { dispatcherMigrations } from "../migrations/dispatcher";
import { describeWhere, TEST_DATABASE_URL } from "./helpers/services";

const INSTANCES = 4;
const describeOnPostgres = describeWhere({ postgres: true });

describeOnPostgres("migrations run by instances starting together on PostgreSQL", () => {
	const schema = `t_mig_${crypto.randomBytes(5).toString("hex")}`;
	const pools: Knex[] = [];

	afterAll(async () => {
		if (pools[0]) await pools[0].raw(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
		await Promise.all(pools.map(pool => pool.destroy()));
	});

	it("lets every instance start, migrating the schema exactly once", async () => {
		const admin = knex({ client: "pg", connection: TEST_DATABASE_URL, pool: { min: 0, max: 1 } });
		pools.push(admin);
		await admin.raw(`CREATE SCHEMA "${schema}"`);
		for (let i = 0; i < INSTANCES; i++) pools.push(knex({ client: "pg", connection: TEST_DATABASE_URL, searchPath: [schema], pool: { min: 0, max: 4 } }));

		const outcomes = await Promise.allSettled(pools.slice(1).map(pool => runMigrations(pool, "dispatcher", dispatcherMigrations)));
		expect(outcomes.map(outcome => (outcome.status === "rejected" ? String(outcome.reason) : "ok"))).toEqual(Array(INSTANCES).fill("ok"));

		const applied = await admin.withSchema(schema).table("knex_migrations_dispatcher").select("name");
		expect(applied.map(row => row.name)).toEqual(dispatcherMigrations.map(migration => migration.name));
		expect(await admin.schema.withSchema(schema).hasTable("deliveries")).toBe(true);
	});

	// Every key column of every index on the schema's tables, with its type and collation.
	const indexKeyCollations = async (db: Knex) => {
		const { rows } = await db.raw(
			`SELECT t.relname || '.' || a.attname AS "column", format_type(a.atttypid, a.atttypmod) AS type, coalesce(c.collname, '') AS collation
			   FROM pg_index i
			   JOIN pg_class t ON t.oid = i.indrelid
			   JOIN pg_namespace n ON n.oid = t.relnamespace AND n.nspname = ?
			   JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = ANY(i.indkey)
			   LEFT JOIN pg_collation c ON c.oid = a.attcollation
			  WHERE t.relname NOT LIKE 'knex_%'
			  GROUP BY 1, 2, 3 ORDER BY 1`,
			[schema],
		);
		return rows as Array<{ column: string; type: string; collation: string }>;
	};
	const textual = (type: string) => type.startsWith("character varying") || type === "text";

	it("keys every indexed id as uuid and orders every other key by bytes; migrating down gives text and its default collation back", async () => {
		const admin = pools[0];
		const keys = (await indexKeyCollations(admin)).filter(key => textual(key.type));
		expect(keys.map(key => key.column)).toEqual(expect.arrayContaining(["deliveries.next_attempt_at", "deliveries.order_key", "delivery_messages.created_at"]));
		expect(keys.filter(key => key.collation !== "C")).toEqual([]);
		// Every id is uuid, which has no collation: the dispatcher's own (016), the event's and the webhook's (017).
		const ownIds = ["deliveries.id", "delivery_attempts.delivery_id"];
		const otherIds = ["deliveries.event_id", "deliveries.webhook_id", "delivery_messages.event_id", "webhook_failures.webhook_id", "webhook_rate_slots.webhook_id"];
		const typesOf = async (columns: string[]) => (await indexKeyCollations(admin)).filter(key => columns.includes(key.column)).map(key => key.type);
		expect(await typesOf(ownIds)).toEqual(["uuid", "uuid"]);
		expect(await typesOf(otherIds)).toEqual(Array(otherIds.length).fill("uuid"));

		const migration = (name: string) => dispatcherMigrations.find(candidate => candidate.name === name)!;
		const byteOrder = migration("013_byte_order_keys");
		// 014's view reads the columns 013 and 016 change, and PostgreSQL will not change a column under a view.
		const firstAttemptInRow = migration("014_first_attempt_in_delivery");
		const uuidOwnIds = migration("016_uuid_own_ids");
		const uuidOtherIds = migration("017_uuid_event_and_webhook_ids");
		const db = pools[1];
		await uuidOtherIds.down(db);
		expect(await typesOf(otherIds)).toEqual(Array(otherIds.length).fill("character varying(36)"));
		await uuidOwnIds.down(db);
		expect(await typesOf(ownIds)).toEqual(["character varying(36)", "character varying(36)"]);
		await firstAttemptInRow.down(db);
		await byteOrder.down(db);
		const restored = (await indexKeyCollations(admin)).filter(key => textual(key.type));
		expect(restored.map(key => key.column)).toEqual(expect.arrayContaining([...ownIds, ...otherIds]));
		expect(restored.filter(key => key.collation === "C")).toEqual([]);
		await byteOrder.up(db);
		await firstAttemptInRow.up(db);
		await uuidOwnIds.up(db);
		await uuidOtherIds.up(db);
		expect((await indexKeyCollations(admin)).filter(key => textual(key.type) && key.collation !== "C")).toEqual([]);
		expect(await typesOf([...ownIds, ...otherIds])).toEqual(Array(ownIds.length + otherIds.length).fill("uuid"));
	});
});
