// Results of hot reads on the embedded SQLite database, kept until the database changes. A page of
// 25 rows costs more to read (SQLite stepping, one JS value per column, knex and its pool) than the
// whole rest of an API request, and clients poll the same page.
//
// The reads run on a read-only connection of their own, and that connection's `data_version`
// says, before every use, whether any other connection has committed since: the service's own
// (whatever the code path: knex, raw statements, transactions), another process's, a test's.
// Nothing that writes has to remember to invalidate anything. Being a separate connection, it
// never sees a transaction that is still open (or later rolled back), only committed data, as
// a read through the service's connection would once that transaction ends. Any commit drops
// every entry: coarse, but it can only cost a read.

/** The parts of a better-sqlite3 connection used here (the package ships no type definitions). */
export interface SqliteReadConnection {
	prepare(sql: string): { all(...bindings: unknown[]): unknown[]; get(...bindings: unknown[]): unknown };
}
type SqliteDatabase = SqliteReadConnection & { pragma(sql: string): unknown; close(): void };
// eslint-disable-next-line @typescript-eslint/no-require-imports
const openDatabase = require("better-sqlite3") as new (filename: string, options: { readonly: boolean; fileMustExist: boolean }) => SqliteDatabase;

export interface SqliteReadCache {
	/**
	 * What `read` answers for `key` on the current committed data: kept from an earlier call while
	 * nothing was committed since. `read` must depend on nothing but the database and `key`, and
	 * what it answers must not be changed by anyone (freeze it).
	 */
	read<T>(key: string, read: (connection: SqliteReadConnection) => T): T;
	close(): void;
}

/**
 * `filename`: the service's SQLite database, which must exist (opened at the first read).
 * `maxEntries` bounds the memory: a page of 100 webhooks, objects and JSON, is about 100 kB.
 */
export function sqliteReadCache(filename: string, maxEntries = 256): SqliteReadCache {
	let connection: SqliteDatabase | undefined;
	let dataVersion: { get(): unknown } | undefined;
	let entriesVersion: unknown;
	const entries = new Map<string, unknown>();
	const statements = new Map<string, ReturnType<SqliteReadConnection["prepare"]>>();
	// Statements prepared once: preparing costs more than running a small query.
	const reusing: SqliteReadConnection = {
		prepare(sql) {
			let statement = statements.get(sql);
			if (!statement) statements.set(sql, (statement = connection!.prepare(sql)));
			return statement;
		},
	};
	return {
		read<T>(key: string, read: (connection: SqliteReadConnection) => T): T {
			if (!connection) {
				connection = new openDatabase(filename, { readonly: true, fileMustExist: true });
				connection.pragma("busy_timeout = 5000");
				dataVersion = connection.prepare("SELECT data_version FROM pragma_data_version");
			}
			const version = (dataVersion!.get() as { data_version: number }).data_version;
			if (version !== entriesVersion) {
				entries.clear();
				entriesVersion = version;
			} else if (entries.has(key)) {
				return entries.get(key) as T;
			}
			const value = read(reusing);
			if (entries.size >= maxEntries) entries.clear();
			entries.set(key, value);
			return value;
		},
		close() {
			connection?.close();
			connection = undefined;
			statements.clear();
			entries.clear();
		},
	};
}
