// What PostgreSQL did over a window of the delivery benchmark, per delivery: transactions and rows
// from pg_stat_database, WAL from the WAL position. The whole database is counted, so nothing else
// should run meanwhile. Used by the backlog's bursts and the persistence floor alike.
import { setTimeout as sleep } from "node:timers/promises";
import type { Knex } from "knex";
import { round } from "./stats";

export interface DatabaseWork {
	transactions: number;
	rows_inserted: number;
	rows_updated: number;
	rows_deleted: number;
	rows_read: number;
	wal_bytes: number;
}

export interface DatabaseCounters extends DatabaseWork {
	lsn: string;
}

export async function databaseCounters(db: Knex): Promise<DatabaseCounters> {
	const { rows } = await db.raw(
		`SELECT xact_commit + xact_rollback AS transactions, tup_inserted AS rows_inserted, tup_updated AS rows_updated, tup_deleted AS rows_deleted,
			tup_returned + tup_fetched AS rows_read, pg_current_wal_lsn()::text AS lsn
		FROM pg_stat_database WHERE datname = current_database()`,
	);
	const row = rows[0];
	return { transactions: Number(row.transactions), rows_inserted: Number(row.rows_inserted), rows_updated: Number(row.rows_updated), rows_deleted: Number(row.rows_deleted), rows_read: Number(row.rows_read), wal_bytes: 0, lsn: row.lsn };
}

export async function databaseWorkBetween(db: Knex, before: DatabaseCounters, deliveries: number): Promise<DatabaseWork> {
	// Backends publish their statistics at most once a second, when idle.
	await sleep(1_500);
	const after = await databaseCounters(db);
	const { rows } = await db.raw("SELECT pg_wal_lsn_diff(?::pg_lsn, ?::pg_lsn) AS bytes", [after.lsn, before.lsn]);
	const per = (field: keyof DatabaseWork) => round((Number(after[field]) - Number(before[field])) / deliveries, 2);
	return { transactions: per("transactions"), rows_inserted: per("rows_inserted"), rows_updated: per("rows_updated"), rows_deleted: per("rows_deleted"), rows_read: per("rows_read"), wal_bytes: round(Number(rows[0].bytes) / deliveries) };
}
