// Ids, keys and ISO timestamps are compared byte by byte: "C" collation on PostgreSQL. Under the
// database's own collation (en_US.UTF-8 or an ICU locale on most servers) every B-tree step on a
// text key runs the locale's comparison, for values that are lowercase hex, digits and fixed
// punctuation whose byte order is already the order wanted. Byte order also keeps those indexes
// valid across C-library upgrades that change a locale's sort order (the glibc 2.28 change
// corrupted text indexes under en_US). PostgreSQL only: SQLite already compares bytes (BINARY).
import type { Knex } from "knex";

type Collation = "C" | "default";

/** PostgreSQL: sets the collation of these columns of one table, keeping their type; one ALTER TABLE, so each index is rebuilt once. */
export async function setColumnCollation(db: Knex, table: string, columns: readonly string[], collation: Collation): Promise<void> {
	const found: { rows: Array<{ column_name: string; type: string }> } = await db.raw(
		`SELECT a.attname AS column_name, format_type(a.atttypid, a.atttypmod) AS type
		   FROM pg_attribute a
		  WHERE a.attrelid = to_regclass(?) AND a.attname = ANY(?) AND NOT a.attisdropped`,
		[table, [...columns]],
	);
	const typeOf = new Map(found.rows.map(row => [row.column_name, row.type]));
	const missing = columns.filter(column => !typeOf.has(column));
	if (missing.length > 0) throw new Error(`setColumnCollation: ${table} has no column ${missing.join(", ")}`);
	const changes = columns.map(column => `ALTER COLUMN "${column}" TYPE ${typeOf.get(column)} COLLATE "${collation}"`);
	await db.raw(`ALTER TABLE "${table}" ${changes.join(", ")}`);
}
