// Keeps SQLite's write-ahead log short from a worker thread, so that the service's event loop
// never runs a checkpoint. Left to itself, SQLite checkpoints inside the COMMIT that crosses 1,000
// log pages: that commit copies the pages into the database file and syncs it, blocking every
// delivery and event for the while. Profiles of a busy dispatcher showed those commits in the
// slowest event-loop turns. With the checkpointer running, the service's connection turns its
// own checkpoints off (wal_autocheckpoint = 0); a checkpointer that stops unexpectedly turns them
// back on, so the log never grows without bound.
import path from "node:path";
import { startTypeScriptWorker } from "./typescript-worker";

export const CHECKPOINT_INTERVAL_MS = 250;
/** The log length (pages) past which the log is made to start over (see sqlite-checkpoint-thread.ts): about 32 MB. */
export const RESTART_LOG_AT_FRAMES = 8_192;
export const SQLITE_DEFAULT_AUTOCHECKPOINT = 1000;

/**
 * Puts the database file in WAL mode (SQLite keeps the mode in the file) before the checkpoint
 * thread and the service's connection open it. On a new file each of them switched it, at about
 * the same moment, and the switch takes the exclusive lock. A test run on a busy machine saw the
 * service's first connection fail there with "database is locked", despite its 5 s busy timeout:
 * what SQLite does when waiting could deadlock (two connections, each holding a shared lock and
 * asking for the exclusive one). With the mode set first, neither switches anything.
 */
export function switchToWriteAheadLog(filename: string): void {
	// Required here, so that a node on PostgreSQL never loads the addon. better-sqlite3 ships no
	// type definitions; this is the part used here.
	// eslint-disable-next-line @typescript-eslint/no-require-imports
	const openDatabase = require("better-sqlite3") as new (filename: string) => { pragma(sql: string): unknown; close(): void };
	const db = new openDatabase(filename);
	try {
		db.pragma("busy_timeout = 5000");
		db.pragma("journal_mode = WAL");
	} finally {
		db.close();
	}
}

export interface SqliteCheckpointer {
	/** Resolves once the thread has its connection; rejects if it cannot open the database. */
	readonly ready: Promise<void>;
	/** A last checkpoint, then the thread ends. */
	stop(): Promise<void>;
}

export function startSqliteCheckpointer(filename: string, onUnexpectedExit: (reason: string) => void, restartAtFrames = RESTART_LOG_AT_FRAMES): SqliteCheckpointer {
	const worker = startTypeScriptWorker(path.join(__dirname, "sqlite-checkpoint-thread.ts"), { filename, intervalMs: CHECKPOINT_INTERVAL_MS, restartAtFrames });
	worker.unref();
	let stopping = false;
	let lastError = "";
	const exited = new Promise<void>(resolve => worker.once("exit", () => resolve()));
	const ready = new Promise<void>((resolve, reject) => {
		worker.on("message", (message: { type: string; message?: string }) => {
			if (message.type === "ready") resolve();
			if (message.type === "error") lastError = message.message ?? "";
		});
		worker.on("error", error => {
			lastError = error.message;
			reject(error);
		});
		worker.once("exit", code => {
			reject(new Error(`the checkpoint thread stopped (exit code ${code})`));
			if (!stopping) onUnexpectedExit(lastError || `exit code ${code}`);
		});
	});
	ready.catch(() => undefined);
	return {
		ready,
		async stop() {
			stopping = true;
			worker.postMessage({ type: "stop" });
			// Unreferenced, the thread would let a stopping process exit before its last checkpoint.
			worker.ref();
			await exited;
		},
	};
}
