// lib/sqlite-read-cache.ts on a real SQLite file in WAL mode, as the service runs it: a kept read
// is answered again only while nothing was committed, whichever connection or code path wrote,
// and a transaction still open (or rolled back) is never seen.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import knex, { type Knex } from "knex";
import { sqliteReadCache, type SqliteReadCache, type SqliteReadConnection } from "../lib/sqlite-read-cache";

describe("SQLite read cache", () => {
	let dir: string;
	let filename: string;
	let service: Knex;
	let cache: SqliteReadCache;
	let reads: number;

	const readNames = () =>
		cache.read("names", (connection: SqliteReadConnection) => {
			reads++;
			return (connection.prepare("SELECT name FROM things ORDER BY name").all() as Array<{ name: string }>).map(row => row.name);
		});
	const openConnection = () => knex({ client: "better-sqlite3", connection: { filename }, useNullAsDefault: true, pool: { min: 1, max: 1 } });

	beforeEach(async () => {
		dir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-read-cache-"));
		filename = path.join(dir, "db.sqlite");
		service = openConnection();
		await service.raw("PRAGMA journal_mode = WAL");
		await service.schema.createTable("things", table => table.string("name"));
		await service("things").insert({ name: "a" });
		cache = sqliteReadCache(filename);
		reads = 0;
	});

	afterEach(async () => {
		cache.close();
		await service.destroy();
		fs.rmSync(dir, { recursive: true, force: true });
	});

	it("answers a kept read while nothing was committed, without reading again", () => {
		expect(readNames()).toEqual(["a"]);
		expect(readNames()).toEqual(["a"]);
		expect(reads).toBe(1);
	});

	it("keeps one answer per key", () => {
		expect(cache.read("other", () => "other answer")).toBe("other answer");
		expect(readNames()).toEqual(["a"]);
		expect(cache.read("other", () => "not used")).toBe("other answer");
	});

	it("reads again after each commit of the service's connection, by knex or by a raw statement", async () => {
		readNames();
		await service("things").insert({ name: "b" });
		expect(readNames()).toEqual(["a", "b"]);
		const connection = (await service.client.acquireConnection()) as { prepare(sql: string): { run(...args: unknown[]): unknown } };
		connection.prepare("UPDATE things SET name = ? WHERE name = ?").run("c", "b");
		await service.client.releaseConnection(connection);
		expect(readNames()).toEqual(["a", "c"]);
		await service.transaction(async trx => {
			await trx("things").where({ name: "c" }).delete();
		});
		expect(readNames()).toEqual(["a"]);
		expect(reads).toBe(4);
	});

	it("reads again after a commit by another connection, and after a schema change", async () => {
		const elsewhere = openConnection();
		try {
			readNames();
			await elsewhere("things").insert({ name: "from elsewhere" });
			expect(readNames()).toEqual(["a", "from elsewhere"]);
			await elsewhere.schema.alterTable("things", table => table.string("colour").defaultTo("red"));
			readNames();
			expect(reads).toBe(3);
		} finally {
			await elsewhere.destroy();
		}
	});

	/** Opens a transaction on the service's connection, runs `whileOpen`, then ends it with `end`. */
	async function inOpenTransaction(insertedName: string, whileOpen: () => void, end: "COMMIT" | "ROLLBACK"): Promise<void> {
		const connection = (await service.client.acquireConnection()) as { exec(sql: string): unknown };
		try {
			connection.exec(`BEGIN; INSERT INTO things (name) VALUES ('${insertedName}')`);
			whileOpen();
			connection.exec(end);
		} finally {
			await service.client.releaseConnection(connection);
		}
	}

	it("never sees a transaction that is still open, and keeps its answer when it is rolled back", async () => {
		readNames();
		await inOpenTransaction("uncommitted", () => expect(readNames()).toEqual(["a"]), "ROLLBACK");
		expect(readNames()).toEqual(["a"]);
		expect(reads).toBe(1);
	});

	it("sees a transaction once it commits", async () => {
		readNames();
		await inOpenTransaction("committed", () => expect(readNames()).toEqual(["a"]), "COMMIT");
		expect(readNames()).toEqual(["a", "committed"]);
		expect(reads).toBe(2);
	});
});
