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
// A connection whose first checkpoint finds the database not yet in WAL mode never looks again:
// every later checkpoint answered "not in WAL mode" (log -1) while the log grew by tens of
// megabytes a second, all of it left for the kernel to write back at once (the benchmark's
// stalls). The service puts the file in WAL mode before it starts this thread
// (switchToWriteAheadLog); the mode is set here too, for a thread started on a file that is not.
db.pragma("journal_mode = WAL");

type CheckpointResult = Array<{ busy: number; log: number; checkpointed: number }>;

// Passes that may run before a RESTART, the RESTART's own not counted: under a writer that never
// pauses, the RESTART copies whatever the last one left.
const MAX_PASSES_BEFORE_RESTART = 8;

/**
 * PASSIVE copies what it can without waiting for, or blocking, the writer and its readers. But
 * the log starts over only when a commit finds it wholly copied, which a steady stream of commits
 * never lets happen: the log then grows without bound (1.4 GB in 40 s of the delivery benchmark),
 * and every read searches its index. Past `restartAtFrames` a RESTART checkpoint makes it start
 * over, and the writer waits while it runs. So the passes before it copy what came in during the
 * previous one until one finds nothing new (each pass is shorter than the one before), and a
 * RESTART with nothing left to copy neither copies nor syncs. It held the writer 1-7 ms when it
 * had a pass's worth of frames left to copy and sync (every 500 ms at 5,000 deliveries a second),
 * and the writer's busy handler sleeps 1, 2, then 5 ms between tries.
 */
function checkpoint(): void {
	const passive = () => (db.pragma("wal_checkpoint(PASSIVE)") as CheckpointResult)[0];
	try {
		let { log } = passive();
		if (log < restartAtFrames) return;
		for (let pass = 1; pass < MAX_PASSES_BEFORE_RESTART; pass++) {
			const before = log;
			const copied = passive();
			log = copied.log;
			// A pass copies the frames there were when it began (less those a reader still needs): the
			// same count at the next pass, all of it copied, means nothing came in meanwhile.
			if (log === before && copied.checkpointed === log) break;
		}
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
