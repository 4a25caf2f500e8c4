// The embedded database's connection as the service opens it (mixins/db.mixin.ts): the write-ahead
// log, foreign keys, and a page cache large enough for the delivery tables' indexes with a backlog
// of a million rows (SQLite's own default is 2 MB), read back from SQLite itself.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { acquireDatabase, releaseDatabase, SQLITE_PAGE_CACHE_KIB } from "../mixins/db.mixin";
import { parseConfig } from "../lib/config";

describe("the embedded database's connection", () => {
	it("runs in WAL mode with foreign keys on and a page cache of SQLITE_PAGE_CACHE_KIB", async () => {
		const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-sqlite-connection-"));
		const config = parseConfig({ DATA_DIR: dataDir, SERVICES: "dispatcher" });
		const db = acquireDatabase(config);
		try {
			const pragma = async (name: string) => Object.values((await db.raw(`PRAGMA ${name}`))[0] as Record<string, unknown>)[0];
			expect(await pragma("journal_mode")).toBe("wal");
			expect(await pragma("foreign_keys")).toBe(1);
			expect(await pragma("synchronous")).toBe(1); // NORMAL
			// Negative: KiB, not pages. SQLite's own default would read -2000.
			expect(await pragma("cache_size")).toBe(-SQLITE_PAGE_CACHE_KIB);
		} finally {
			await releaseDatabase(config);
			fs.rmSync(dataDir, { recursive: true, force: true });
		}
	});
});
