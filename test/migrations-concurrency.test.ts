// Several instances of one service starting at the same moment on a fresh PostgreSQL schema
// (a cluster's dispatchers, `docker compose up --scale dispatcher=3`) must all start: the
// cluster fault tests saw the second dispatcher die on knex's own migrations table, created
// twice at once. Each instance here has its own knex pool, as separate processes do.
import crypto from "node:crypto";
import knex, { type Knex } from "knex";
import { runMigrations } from "../mixins/db.mixin";
import { dispatcherMigrations } from "../migrations/dispatcher";
import { TEST_DATABASE_URL } from "./helpers/services";

const INSTANCES = 4;
const describeOnPostgres = process.env.TEST_POSTGRES === "yes" ? describe : describe.skip;

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
});
