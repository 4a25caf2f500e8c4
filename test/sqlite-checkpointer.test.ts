// The embedded database's write-ahead log is checkpointed by a thread of its own
// (lib/sqlite-checkpointer.ts), never by the service's connection: that connection has automatic
// checkpoints off, and what it writes still reaches the database file. A checkpointer that stops
// unexpectedly hands checkpoints back to the service's connection. The thread checkpoints whichever
// of the two opens a new database first, and under a steady stream of commits it makes the log
// start over rather than grow.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { acquireDatabase, releaseDatabase } from "../mixins/db.mixin";
import { parseConfig } from "../lib/config";
import { CHECKPOINT_INTERVAL_MS, SQLITE_DEFAULT_AUTOCHECKPOINT, startSqliteCheckpointer } from "../lib/sqlite-checkpointer";
import { type SqliteConnection } from "../lib/sqlite-statements";
import { sleep, waitUntil } from "./helpers/delivery-stack";

// better-sqlite3 ships no type definitions: the service's part of it, and what is used here besides.
type Connection = SqliteConnection & { pragma(sql: string): unknown; exec(sql: string): void; close(): void };
// eslint-disable-next-line @typescript-eslint/no-require-imports
const openDatabase = require("better-sqlite3") as new (filename: string) => Connection;

const PAYLOAD = "x".repeat(4_000);

/**
 * How many times the write-ahead log has started over: its header's checkpoint sequence number
 * (bytes 12-15, big-endian), which SQLite counts up each time a writer goes back to the log's start.
 */
function logRestarts(file: string): number {
	const header = Buffer.alloc(16);
	const fd = fs.openSync(`${file}-wal`, "r");
	try {
		fs.readSync(fd, header, 0, 16, 0);
	} finally {
		fs.closeSync(fd);
	}
	return header.readUInt32BE(12);
}

/** A connection set up as the service's (see mixins/db.mixin.ts), with a table to fill. */
function serviceConnection(file: string) {
	const connection = new openDatabase(file);
	connection.pragma("busy_timeout = 5000");
	connection.pragma("journal_mode = WAL");
	connection.pragma("wal_autocheckpoint = 0");
	connection.exec("CREATE TABLE filler (id INTEGER PRIMARY KEY, payload TEXT)");
	const insert = connection.prepare("INSERT INTO filler (payload) VALUES (?)");
	return { connection, commitRows: (rows: number) => connection.transaction(() => Array.from({ length: rows }, () => insert.run(PAYLOAD)))() };
}

/** A new database folder and a checkpointer on it; both are gone after `work`. */
async function withCheckpointer(restartAtFrames: number | undefined, work: (file: string) => Promise<void>): Promise<void> {
	const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-checkpoint-"));
	const file = path.join(dataDir, "service.sqlite");
	const checkpointer = startSqliteCheckpointer(file, () => undefined, restartAtFrames);
	try {
		await checkpointer.ready;
		await work(file);
	} finally {
		await checkpointer.stop();
		fs.rmSync(dataDir, { recursive: true, force: true });
	}
}

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
			for (let batch = 0; batch < 20; batch += 1) {
				await db.transaction(trx => trx("filler").insert(Array.from({ length: 100 }, () => ({ payload: PAYLOAD }))));
			}
			const sizeAfter = await waitUntil(() => fs.statSync(file).size, size => size > sizeBefore + 7_000_000, "the log checkpointed into the database file");
			console.log(`database file: ${sizeBefore} → ${sizeAfter} bytes, written by the checkpoint thread`);
			expect(await db("filler").count({ n: "*" })).toEqual([{ n: 2000 }]);
		} finally {
			await releaseDatabase(config);
			fs.rmSync(dataDir, { recursive: true, force: true });
		}
	});

	it("checkpoints a database that was not yet in WAL mode when the thread first looked at it", async () => {
		// The service's order: the thread starts (and checkpoints) before the first connection of
		// the service has opened the file and set WAL mode. Such a checkpointer once stayed blind
		// to the log for the whole life of the process.
		await withCheckpointer(undefined, async file => {
			// Some checkpoints of the thread's own run before the service's connection is set up.
			await sleep(3 * CHECKPOINT_INTERVAL_MS);
			const service = serviceConnection(file);
			try {
				const sizeBefore = fs.statSync(file).size;
				for (let batch = 0; batch < 20; batch += 1) service.commitRows(100);
				const sizeAfter = await waitUntil(() => fs.statSync(file).size, size => size > sizeBefore + 7_000_000, "the log checkpointed into the database file");
				console.log(`database file: ${sizeBefore} → ${sizeAfter} bytes, log ${fs.statSync(`${file}-wal`).size} bytes`);
			} finally {
				service.connection.close();
			}
		});
	});

	it("makes the log start over under a steady stream of commits, instead of letting it grow", async () => {
		// 250 pages (1 MB) here, so that a few seconds of writing cross it many times over.
		await withCheckpointer(250, async file => {
			const service = serviceConnection(file);
			try {
				service.commitRows(1);
				const restartsBefore = logRestarts(file);
				// Small commits about a millisecond apart, as a busy service's intake makes them: the
				// checkpointer never finds the log wholly copied between two of them. Until the log has
				// started over three times, bounded by rows rather than seconds: on a loaded machine the
				// thread may get no core for a while, and the log grows meanwhile.
				const MAX_ROWS = 20_000;
				let rows = 1;
				let largestLog = 0;
				while (rows < MAX_ROWS && logRestarts(file) - restartsBefore < 3) {
					for (let i = 0; i < 10; i += 1, rows += 1) {
						service.commitRows(1);
						await sleep(1);
					}
					largestLog = Math.max(largestLog, fs.statSync(`${file}-wal`).size);
				}
				const restarts = logRestarts(file) - restartsBefore;
				console.log(`${rows * PAYLOAD.length} bytes committed; the log started over ${restarts} times, its file reached ${largestLog} bytes`);
				// Never started over, the log would have grown by every page of up to 20,000 commits.
				expect(restarts).toBeGreaterThanOrEqual(3);
			} finally {
				service.connection.close();
			}
		});
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
