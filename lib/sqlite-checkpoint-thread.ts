// The inside of the SQLite checkpointer (see lib/sqlite-checkpointer.ts): a connection of its own
// that copies the write-ahead log into the database file every few hundred milliseconds.
import { parentPort, workerData } from "node:worker_threads";

interface Options {
	filename: string;
	intervalMs: number;
}

// better-sqlite3 ships no type definitions; this is the part used here.
type Database = { pragma(sql: string): unknown; close(): void };
// eslint-disable-next-line @typescript-eslint/no-require-imports
const openDatabase = require("better-sqlite3") as new (filename: string) => Database;

const port = parentPort;
if (!port) throw new Error("lib/sqlite-checkpoint-thread.ts runs only inside a worker thread");
const { filename, intervalMs } = workerData as Options;

const db = new openDatabase(filename);
db.pragma("busy_timeout = 5000");

// PASSIVE: copies what it can without waiting for, or blocking, the writer and its readers.
function checkpoint(): void {
	try {
		db.pragma("wal_checkpoint(PASSIVE)");
	} catch (error) {
		port!.postMessage({ type: "error", message: (error as Error).message });
	}
}

const timer = setInterval(checkpoint, intervalMs);
port.on("message", (message: { type: string }) => {
	if (message.type !== "stop") return;
	clearInterval(timer);
	checkpoint();
	db.close();
	port.close();
});
port.postMessage({ type: "ready" });
