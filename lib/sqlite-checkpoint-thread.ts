// The inside of the SQLite checkpointer (see lib/sqlite-checkpointer.ts): a connection of its own
// that copies the write-ahead log into the database file every few hundred milliseconds.
import { parentPort, workerData } from "node:worker_threads";

interface Options {
	filename: string;
	intervalMs: number;
	restartAtFrames: number;
}

// better-sqlite3 ships no type definitions; this is the part used here.
type Database = { pragma(sql: string): unknown; close(): void };
// eslint-disable-next-line @typescript-eslint/no-require-imports
const openDatabase = require("better-sqlite3") as new (filename: string) => Database;

const port = parentPort;
if (!port) throw new Error("lib/sqlite-checkpoint-thread.ts runs only inside a worker thread");
const { filename, intervalMs, restartAtFrames } = workerData as Options;

const db = new openDatabase(filename);
db.pragma("busy_timeout = 5000");
// The thread starts before the service's connection has opened the file. A connection whose
// first checkpoint finds the database not yet in WAL mode never looks again: every later
// checkpoint answered "not in WAL mode" (log -1) while the log grew by tens of megabytes a second,
// all of it left for the kernel to write back at once (the benchmark's stalls). Setting the
// mode here, as the service's connection does, makes the order of the two irrelevant.
db.pragma("journal_mode = WAL");

type CheckpointResult = Array<{ busy: number; log: number; checkpointed: number }>;

/**
 * PASSIVE copies what it can without waiting for, or blocking, the writer and its readers. But
 * the log starts over only when a commit finds it wholly copied, which a steady stream of commits
 * never lets happen: the log then grows without bound (1.4 GB in 40 s of the delivery benchmark),
 * and every read searches its index. Past `restartAtFrames`, a second PASSIVE copies what came in
 * during the first, and a RESTART checkpoint then holds the writer back only while it copies the
 * few frames left, so that the next commit starts the log over; the file keeps its size and is
 * written again from its start.
 */
function checkpoint(): void {
	try {
		const [{ log }] = db.pragma("wal_checkpoint(PASSIVE)") as CheckpointResult;
		if (log < restartAtFrames) return;
		db.pragma("wal_checkpoint(PASSIVE)");
		db.pragma("wal_checkpoint(RESTART)");
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
