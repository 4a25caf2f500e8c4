// The embedded database's write-ahead log is checkpointed by a thread of its own
// (lib/sqlite-checkpointer.ts), never by the service's connection: that connection has automatic
// checkpoints off, and what it writes still reaches the database file. A checkpointer that stops
// unexpectedly hands checkpoints back to the service's connection.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { acquireDatabase, releaseDatabase } from "../mixins/db.mixin";
import { parseConfig } from "../lib/config";
import { SQLITE_DEFAULT_AUTOCHECKPOINT, startSqliteCheckpointer } from "../lib/sqlite-checkpointer";
import { waitUntil } from "./helpers/delivery-stack";

describe("SQLite checkpoints off the event loop", () => {
	it("copies the log into the database file while the service's connection never checkpoints", async () => {
		const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-checkpoint-"));
		const config = parseConfig({ DATA_DIR: dataDir, SERVICES: "dispatcher" });
		const db = acquireDatabase(config);
		try {
			const [{ wal_autocheckpoint }] = await db.raw("PRAGMA wal_autocheckpoint");
			expect(wal_autocheckpoint).toBe(0);

			await db.schema.createTable("filler", table => {
				table.increments("id");
				table.text("payload");
			});
			const file = path.join(dataDir, "service.sqlite");
			const sizeBefore = fs.statSync(file).size;
			// About 8 MB, past the 1,000 pages (4 MB) at which SQLite would checkpoint by itself.
			const payload = "x".repeat(4_000);
			for (let batch = 0; batch < 20; batch += 1) {
				await db.transaction(trx => trx("filler").insert(Array.from({ length: 100 }, () => ({ payload }))));
			}
			const sizeAfter = await waitUntil(() => fs.statSync(file).size, size => size > sizeBefore + 7_000_000, "the log checkpointed into the database file");
			console.log(`database file: ${sizeBefore} → ${sizeAfter} bytes, written by the checkpoint thread`);
			expect(await db("filler").count({ n: "*" })).toEqual([{ n: 2000 }]);
		} finally {
			await releaseDatabase(config);
			fs.rmSync(dataDir, { recursive: true, force: true });
		}
	});

	it("reports a checkpointer that cannot open its database, so that the caller checkpoints again", async () => {
		const reasons: string[] = [];
		const checkpointer = startSqliteCheckpointer("/nonexistent/folder/service.sqlite", reason => reasons.push(reason));
		await expect(checkpointer.ready).rejects.toThrow();
		await waitUntil(() => reasons.length, n => n === 1, "the unexpected stop reported");
		expect(reasons[0]).toMatch(/unable to open|directory does not exist|exit code/i);
		expect(SQLITE_DEFAULT_AUTOCHECKPOINT).toBe(1000);
	});
});
