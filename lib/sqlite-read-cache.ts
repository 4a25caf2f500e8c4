// Results of hot SQLite reads, kept until the database may have changed. On the embedded database
// a page of 25 rows costs more to read (SQLite stepping, one JS value per column) than the whole
// rest of an API request, and clients poll the same page. Whether anything may have changed is
// asked of SQLite itself before every use, on the connection the read would run on, so that no
// writer has to remember to invalidate anything:
// - `total_changes()`: rows inserted, updated or deleted through this connection, whatever the
//   code path (knex, raw statements, transactions, later rolled back or not);
// - `data_version`: commits by any other connection to the file (another process, a test's own
//   connection);
// - `schema_version`: any schema change (a migration).
// A change anywhere in the database drops every entry; that is coarse, but it can only cost a read.
import type { Knex } from "knex";

/** The parts of a better-sqlite3 connection used here (the package ships no type definitions). */
export interface SqliteReadConnection {
	prepare(sql: string): { all(...bindings: unknown[]): unknown[]; get(...bindings: unknown[]): unknown; raw(raw: boolean): { get(): unknown[] } };
	/** True while a transaction is open on the connection. */
	readonly inTransaction: boolean;
}

const DATABASE_VERSION_SQL = "SELECT d.data_version, s.schema_version, total_changes() FROM pragma_data_version AS d, pragma_schema_version AS s";

export type SqliteCachedRead = <T>(key: string, read: (connection: SqliteReadConnection) => T) => Promise<T>;

/**
 * `cachedRead(key, read)` runs `read` on the SQLite connection of `db` (synchronously, so nothing
 * interleaves), or answers what it answered for `key` when the database has not changed since.
 * `read` must depend on nothing but the database and `key`, and its result must not be mutated.
 */
export function createSqliteReadCache(db: Knex, maxEntries = 1_000): SqliteCachedRead {
	// Per connection: a replaced connection starts its counters again from zero.
	const cachesByConnection = new WeakMap<SqliteReadConnection, Map<string, { version: string; value: unknown }>>();
	return async <T>(key: string, read: (connection: SqliteReadConnection) => T): Promise<T> => {
		const connection = (await db.client.acquireConnection()) as SqliteReadConnection;
		try {
			// knex holds the pool's one connection for a whole transaction, so this is a safeguard:
			// a read inside someone's transaction could see writes that are later rolled back.
			if (connection.inTransaction) return read(connection);
			const version = connection.prepare(DATABASE_VERSION_SQL).raw(true).get().join(":");
			let entries = cachesByConnection.get(connection);
			if (!entries) cachesByConnection.set(connection, (entries = new Map()));
			const cached = entries.get(key);
			if (cached && cached.version === version) return cached.value as T;
			const value = read(connection);
			if (entries.size >= maxEntries) entries.clear();
			entries.set(key, { version, value });
			return value;
		} finally {
			await db.client.releaseConnection(connection);
		}
	};
}
