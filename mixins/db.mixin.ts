// Database access for services that own tables. One knex instance per process and database
// is shared by every local service: on SQLite that makes this process the single writer
// (a pool of one connection, WAL), on PostgreSQL it shares one connection pool.
// Each service runs its own migrations, recorded in its own knex migrations table.
import path from "node:path";
import fs from "node:fs";
import knex, { type Knex } from "knex";
import type { Service, ServiceSchema, ServiceSettingSchema } from "moleculer";
import { configOf, invalidConfiguration, type AppConfig } from "../lib/config";
import { sqliteAddonProblem } from "../lib/sqlite-addon";
import { SQLITE_DEFAULT_AUTOCHECKPOINT, startSqliteCheckpointer, switchToWriteAheadLog, type SqliteCheckpointer } from "../lib/sqlite-checkpointer";

export interface Migration {
	name: string;
	up(db: Knex): Promise<void>;
	down(db: Knex): Promise<void>;
}

interface SharedConnection {
	db: Knex;
	users: number;
	checkpointer?: SqliteCheckpointer;
}

const connections = new Map<string, SharedConnection>();

function connectionKey(config: AppConfig): string {
	return config.DATABASE_URL ? `${config.DATABASE_URL}#${config.DATABASE_SCHEMA ?? "public"}` : path.resolve(config.DATA_DIR, "service.sqlite");
}

export function isPostgres(db: Knex): boolean {
	return db.client.config.client === "pg";
}

/** The file of an embedded SQLite database; undefined on PostgreSQL. */
export function sqliteFilename(db: Knex): string | undefined {
	return isPostgres(db) ? undefined : (db.client.config.connection as { filename: string }).filename;
}

function createKnex(config: AppConfig): SharedConnection {
	if (config.DATABASE_URL) {
		const schema = config.DATABASE_SCHEMA;
		const db = knex({
			client: "pg",
			connection: config.DATABASE_URL,
			searchPath: schema ? [schema] : undefined,
			pool: {
				min: 0,
				max: 10,
				// Create the schema lazily so each test run (or tenant deployment) can have its own.
				afterCreate: (conn: { query: (sql: string, cb: (err?: Error) => void) => void }, done: (err?: Error) => void) => {
					if (!schema) return done();
					// Connections opened at the same moment race on IF NOT EXISTS; the loser's unique
					// violation (23505) or duplicate_schema (42P06) means the schema is there.
					conn.query(`CREATE SCHEMA IF NOT EXISTS "${schema}"`, (err?: Error & { code?: string }) =>
						done(err && err.code !== "23505" && err.code !== "42P06" ? err : undefined),
					);
				},
			},
			acquireConnectionTimeout: 10_000,
		});
		return { db, users: 0 };
	}
	const addonProblem = sqliteAddonProblem();
	if (addonProblem) throw invalidConfiguration([addonProblem]);
	fs.mkdirSync(config.DATA_DIR, { recursive: true });
	const filename = path.resolve(config.DATA_DIR, "service.sqlite");
	switchToWriteAheadLog(filename);
	let checkpointsElsewhere = true;
	const db = knex({
		client: "better-sqlite3",
		connection: { filename },
		useNullAsDefault: true,
		pool: {
			min: 1,
			max: 1,
			afterCreate: (conn: SqliteHandle, done: (err?: Error) => void) => {
				cachePreparedStatements(conn);
				// First, so that the statements below wait out the checkpointer's short locks.
				conn.pragma("busy_timeout = 5000");
				conn.pragma("journal_mode = WAL");
				conn.pragma("synchronous = NORMAL");
				conn.pragma("foreign_keys = ON");
				if (checkpointsElsewhere) conn.pragma("wal_autocheckpoint = 0");
				done();
			},
		},
	});
	const checkpointer = startSqliteCheckpointer(filename, reason => {
		checkpointsElsewhere = false;
		process.emitWarning(`SQLite checkpoint thread stopped (${reason}); the service's connection checkpoints by itself again`);
		db.raw(`PRAGMA wal_autocheckpoint = ${SQLITE_DEFAULT_AUTOCHECKPOINT}`).catch(() => undefined);
	});
	return { db, users: 0, checkpointer };
}

interface SqliteHandle {
	pragma(sql: string): unknown;
	prepare(sql: string): unknown;
}

const STATEMENT_CACHE_SIZE = 500;

/**
 * knex prepares every SQLite statement anew, and preparing often costs more than running the
 * query. better-sqlite3 statements are reusable (SQLite re-prepares them itself after a schema
 * change), so keep the most recently used ones per connection.
 */
function cachePreparedStatements(conn: SqliteHandle): void {
	const prepare = conn.prepare.bind(conn);
	const cache = new Map<string, unknown>();
	conn.prepare = (sql: string) => {
		let statement = cache.get(sql);
		if (statement) {
			cache.delete(sql); // re-insert below: Map order doubles as recency order
		} else {
			statement = prepare(sql);
			if (cache.size >= STATEMENT_CACHE_SIZE) cache.delete(cache.keys().next().value as string);
		}
		cache.set(sql, statement);
		return statement;
	};
}

/** Takes a reference on the process-wide knex instance for this configuration. */
export function acquireDatabase(config: AppConfig): Knex {
	const key = connectionKey(config);
	let shared = connections.get(key);
	if (!shared) {
		shared = createKnex(config);
		connections.set(key, shared);
	}
	shared.users += 1;
	return shared.db;
}

export async function releaseDatabase(config: AppConfig): Promise<void> {
	const key = connectionKey(config);
	const shared = connections.get(key);
	if (!shared) return;
	shared.users -= 1;
	if (shared.users <= 0) {
		connections.delete(key);
		await shared.db.destroy();
		await shared.checkpointer?.stop();
	}
}

export async function runMigrations(db: Knex, owner: string, migrations: Migration[]): Promise<void> {
	const migrate = () =>
		db.migrate.latest({
			tableName: `knex_migrations_${owner}`,
			migrationSource: {
				getMigrations: async () => migrations,
				getMigrationName: (migration: Migration) => migration.name,
				getMigration: async (migration: Migration) => migration,
			},
		});
	if (!isPostgres(db)) {
		await migrate();
		return;
	}
	// Several instances of a service starting together on a fresh database (two dispatchers, say)
	// would race to create knex's own bookkeeping tables, and the loser would fail to start:
	// knex's migration lock only works once those tables exist. An advisory lock, held by a
	// transaction on one connection while the migrations run on others, lets one instance
	// migrate at a time; the others then find nothing left to do.
	await db.transaction(async lockHolder => {
		await lockHolder.raw("SELECT pg_advisory_xact_lock(hashtext(coalesce(current_schema(), '') || ':migrations:' || ?))", [owner]);
		await migrate();
	});
}

/** ISO 8601 UTC text for timestamps: the same representation on SQLite and PostgreSQL. */
export function nowIso(): string {
	return new Date().toISOString();
}

export interface DbServiceThis extends Service {
	db: Knex;
	config: AppConfig;
}

/** DbMixin's stopped hook: lets go of the service's database connection. */
export async function releaseServiceDatabase(this: DbServiceThis): Promise<void> {
	await releaseDatabase(this.config);
}

/**
 * Gives a service `this.db` and `this.config`, and runs its migrations before it starts.
 * `owner` names the migrations table, so each service's schema history stays its own.
 *
 * List it LAST in `mixins`. Moleculer runs the mixins' created and started hooks from the last
 * mixin listed to the first, and their stopped hooks the other way round: last in the list, the
 * database exists before any other part is created or started, and is released only after every
 * other part has stopped (and written what it still held).
 */
export function DbMixin(owner: string, migrations: Migration[]): Partial<ServiceSchema<ServiceSettingSchema, DbServiceThis>> {
	return {
		created(this: DbServiceThis) {
			this.config = configOf(this.broker);
			this.db = acquireDatabase(this.config);
		},
		async started(this: DbServiceThis) {
			await runMigrations(this.db, owner, migrations);
		},
		stopped: releaseServiceDatabase,
	};
}
