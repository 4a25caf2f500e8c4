// The delivery benchmark's persistence floor (bench/lib/persistence-floor.ts) against the test
// PostgreSQL: it must write and update every delivery it counts, read real CPU and WAL, and leave
// the shared server as it found it, never touching a schema that is not its own. It needs
// PostgreSQL, which CI requires (test/helpers/services.ts).
import crypto from "node:crypto";
import knex, { type Knex } from "knex";
import { persistenceFloor } from "../bench/lib/persistence-floor";
import { describeWhere, TEST_DATABASE_URL } from "./helpers/services";

const describeOnPostgres = describeWhere({ postgres: true });

describeOnPostgres("the persistence floor", () => {
	let admin: Knex;
	beforeAll(() => {
		admin = knex({ client: "pg", connection: TEST_DATABASE_URL, pool: { min: 0, max: 1 } });
	});
	afterAll(() => admin.destroy());

	const schemaExists = async (schema: string) => (await admin.raw("SELECT 1 FROM information_schema.schemata WHERE schema_name = ?", [schema])).rows.length === 1;

	it("persists and updates whole batches, reads their cost, and removes its schema", async () => {
		const schema = `t_floor_${crypto.randomBytes(4).toString("hex")}`;
		const floor = await persistenceFloor(TEST_DATABASE_URL, schema, 500);
		expect(floor.deliveries_per_batch).toBe(60);
		expect(floor.deliveries).toBe(540); // 500 rounded up to whole batches
		expect(floor.cpu_us_per_delivery.client).toBeGreaterThan(0);
		expect(floor.cpu_us_per_delivery.total).toBeCloseTo(floor.cpu_us_per_delivery.client + floor.cpu_us_per_delivery.database, 1);
		// An insert and an update of each row reach the WAL: at least a heap record each.
		expect(floor.postgresql_per_delivery.wal_bytes).toBeGreaterThan(50);
		expect(await schemaExists(schema)).toBe(false);
	});

	it("refuses a schema that already exists, and leaves it and its tables alone", async () => {
		const schema = `t_floor_${crypto.randomBytes(4).toString("hex")}`;
		await admin.raw(`CREATE SCHEMA "${schema}"`);
		await admin.raw(`CREATE TABLE "${schema}".kept (id integer)`);
		try {
			await expect(persistenceFloor(TEST_DATABASE_URL, schema, 60)).rejects.toThrow(/already exists/);
			expect((await admin.raw(`SELECT count(*)::int AS n FROM "${schema}".kept`)).rows[0].n).toBe(0);
		} finally {
			await admin.raw(`DROP SCHEMA "${schema}" CASCADE`);
		}
	});
});
