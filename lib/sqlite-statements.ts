// Raw better-sqlite3 access for hot write paths on the embedded SQLite database. For a multi-row
// statement preparing costs more than running it; a single-row statement prepared once (the
// connection caches it, see mixins/db.mixin.ts) and run once per row is several times cheaper.
// PostgreSQL is the opposite (each statement is a network round trip), so callers keep
// multi-row statements there and use this only when the database is SQLite.
import type { Knex } from "knex";

/** The parts of better-sqlite3 used here (the package ships no type definitions). */
export interface SqliteStatement {
	run(...bindings: unknown[]): { changes: number };
}
export interface SqliteConnection {
	prepare(sql: string): SqliteStatement;
	/** better-sqlite3: wraps `work` in BEGIN … COMMIT (ROLLBACK if it throws). */
	transaction<T>(work: () => T): () => T;
}

/** better-sqlite3 binds no booleans. */
export const sqliteBoolean = (value: boolean | null | undefined): number | null => (value === null || value === undefined ? null : value ? 1 : 0);

/**
 * Runs `work` as one synchronous transaction on the SQLite connection, taken from knex's pool
 * (of one connection, so no other query can interleave) and given back after. Compared with a
 * knex transaction this saves the promise hops between BEGIN, each statement and COMMIT: the
 * writer is held for the work alone, not while the event loop serves other callbacks.
 */
export async function inSqliteTransaction<T>(db: Knex, work: (connection: SqliteConnection) => T): Promise<T> {
	const connection = (await db.client.acquireConnection()) as SqliteConnection;
	try {
		return connection.transaction(() => work(connection))();
	} finally {
		await db.client.releaseConnection(connection);
	}
}
