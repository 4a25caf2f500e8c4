// lib/sqlite-read-cache.ts on a real SQLite file (WAL, as the service runs it): a kept read is
// answered again only while SQLite says nothing changed, whichever connection or code path wrote.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import knex, { type Knex } from "knex";
import { createSqliteReadCache, type SqliteCachedRead, type SqliteReadConnection } from "../lib/sqlite-read-cache";

describe("SQLite read cache", () => {
	let dir: string;
	let db: Knex;
	let other: Knex;
	let cachedRead: SqliteCachedRead;
	let reads: number;

	const readNames = () =>
		cachedRead("names", (connection: SqliteReadConnection) => {
			reads++;
			return (connection.prepare("SELECT name FROM things ORDER BY name").all() as Array<{ name: string }>).map(row => row.name);
		});

	beforeEach(async () => {
		dir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-read-cache-"));
		const filename = path.join(dir, "db.sqlite");
		db = knex({ client: "better-sqlite3", connection: { filename }, useNullAsDefault: true, pool: { min: 1, max: 1 } });
		other = knex({ client: "better-sqlite3", connection: { filename }, useNullAsDefault: true, pool: { min: 1, max: 1 } });
		await db.raw("PRAGMA journal_mode = WAL");
		await db.schema.createTable("things", table => table.string("name"));
		await db("things").insert({ name: "a" });
		cachedRead = createSqliteReadCache(db);
		reads = 0;
	});

	afterEach(async () => {
		await db.destroy();
		await other.destroy();
		fs.rmSync(dir, { recursive: true, force: true });
	});

	it("answers a kept read while nothing changed, without reading again", async () => {
		expect(await readNames()).toEqual(["a"]);
		expect(await readNames()).toEqual(["a"]);
		expect(reads).toBe(1);
	});

	it("keeps one answer per key", async () => {
		const other = await cachedRead("other", () => "other answer");
		expect(other).toBe("other answer");
		expect(await readNames()).toEqual(["a"]);
		expect(await cachedRead("other", () => "not used")).toBe("other answer");
	});

	it("reads again after a write through the same connection, by knex or by a raw statement", async () => {
		await readNames();
		await db("things").insert({ name: "b" });
		expect(await readNames()).toEqual(["a", "b"]);
		const connection = (await db.client.acquireConnection()) as { prepare(sql: string): { run(...args: unknown[]): unknown } };
		connection.prepare("UPDATE things SET name = ? WHERE name = ?").run("c", "b");
		await db.client.releaseConnection(connection);
		expect(await readNames()).toEqual(["a", "c"]);
		await db("things").where({ name: "c" }).delete();
		expect(await readNames()).toEqual(["a"]);
		expect(reads).toBe(4);
	});

	it("reads again after a commit by another connection to the same file", async () => {
		await readNames();
		await other("things").insert({ name: "from elsewhere" });
		expect(await readNames()).toEqual(["a", "from elsewhere"]);
		expect(reads).toBe(2);
	});

	it("reads again after a schema change", async () => {
		await readNames();
		await other.schema.alterTable("things", table => table.string("colour").defaultTo("red"));
		await readNames();
		expect(reads).toBe(2);
	});

	it("reads again after a transaction that was rolled back (its answer is unchanged)", async () => {
		await readNames();
		await expect(
			db.transaction(async trx => {
				await trx("things").insert({ name: "never" });
				throw new Error("roll back");
			}),
		).rejects.toThrow("roll back");
		expect(await readNames()).toEqual(["a"]);
		expect(reads).toBe(2);
	});

	it("neither answers from nor keeps a read made inside an open transaction", async () => {
		await readNames();
		await db.raw("BEGIN");
		await db("things").insert({ name: "uncommitted" });
		expect(await readNames()).toEqual(["a", "uncommitted"]);
		await db.raw("ROLLBACK");
		expect(await readNames()).toEqual(["a"]);
		expect(reads).toBe(3);
	});
});
