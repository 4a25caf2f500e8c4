// Raw pg access for the dispatcher's hot writes on PostgreSQL (the counterpart of
// lib/sqlite-statements.ts). Through knex.raw every batch is a new unnamed statement with one
// placeholder per value: the server parses and plans it again each time, and knex rewrites the
// placeholders on our event loop. Here a batch's rows travel as one array per column (unnest),
// so the statement's text is the same for any batch size and can be a named prepared statement,
// parsed and planned once per connection. Measured in isolation on the development machine, for
// the intake insert of one event with 10 deliveries: p50 0.9 ms through knex.raw, 0.6 ms here.
import type { Knex } from "knex";

/** The part of pg's Client used here (the named form of query). */
export interface PgConnection {
	query<Row>(config: { name: string; text: string; values: unknown[] }): Promise<{ rows: Row[] }>;
}

/** A statement prepared once per connection, under its name. */
export interface PreparedStatement {
	name: string;
	text: string;
}

// PostgreSQL plans a prepared statement's first five executions for their values, then caches a
// generic plan made for the table as it is at that moment, until an ANALYZE invalidates it. On a
// new database the tables are empty then: the result write's generic plan joined `deliveries` by
// a sequential scan, which costs more with every row, until autovacuum's first ANALYZE (up to a
// minute or more later). In the delivery benchmark's fresh schemas that was PostgreSQL's whole
// tail. So each connection prepares a statement again, under a new name, after 64, 512, 4096
// and 32768 executions: the plan follows a table that grows from empty, and then stays.
const REPLAN_AFTER_EXECUTIONS = [64, 512, 4_096, 32_768];

// A migration that changes a column a prepared statement returns (its type, or its collation as
// 013_byte_order_keys does) makes PostgreSQL refuse that statement on every connection that had
// prepared it: "cached plan must not change result type", for good. pg keeps the statement's name
// as prepared, so the only way out is another name: `renewals` counts those.
interface StatementUse {
	executions: number;
	renewals: number;
}
const uses = new WeakMap<PgConnection, Map<string, StatementUse>>();

function useOf(connection: PgConnection, statement: PreparedStatement): StatementUse {
	let byName = uses.get(connection);
	if (!byName) uses.set(connection, (byName = new Map()));
	let use = byName.get(statement.name);
	if (!use) byName.set(statement.name, (use = { executions: 0, renewals: 0 }));
	return use;
}

/** The name to run a statement under on this connection: a new one at each replanning threshold, and after a schema change refused it. */
export function preparedNameFor(connection: PgConnection, statement: PreparedStatement): string {
	const use = useOf(connection, statement);
	use.executions += 1;
	const generation = REPLAN_AFTER_EXECUTIONS.filter(threshold => use.executions > threshold).length;
	return `${statement.name}${generation === 0 ? "" : `_${generation}`}${use.renewals === 0 ? "" : `_r${use.renewals}`}`;
}

function isRefusedAfterSchemaChange(err: unknown): boolean {
	return (err as { code?: string }).code === "0A000" && /cached plan must not change result type/.test((err as Error).message);
}

/**
 * Runs a prepared statement on a connection taken from knex's pool (so the pool's size, its
 * acquire timeout and its handling of broken connections still apply) and gives it back after.
 * A statement refused after a schema change is prepared again under a new name: at once outside a
 * transaction (the refusal ran nothing), at the caller's next try inside one (which it aborted).
 */
export async function runPrepared<Row>(db: Knex, statement: PreparedStatement, values: unknown[]): Promise<Row[]> {
	const connection = (await db.client.acquireConnection()) as PgConnection;
	const run = async () => (await connection.query<Row>({ name: preparedNameFor(connection, statement), text: statement.text, values })).rows;
	try {
		return await run();
	} catch (err) {
		if (!isRefusedAfterSchemaChange(err)) throw err;
		useOf(connection, statement).renewals += 1;
		if (db.isTransaction) throw err;
		return await run();
	} finally {
		await db.client.releaseConnection(connection);
	}
}

/**
 * `unnest($first::type[], ...) AS alias(column, ...)`: a set of rows from one array per column,
 * e.g. `unnestColumns([["id", "text"], ["attempt", "integer"]], 1, "v")`; with `ordinality`, a
 * last column of that name numbers the rows from 1, in the arrays' order.
 */
export function unnestColumns(columns: ReadonlyArray<readonly [name: string, type: string, ...rest: unknown[]]>, first: number, alias: string, ordinality?: string): string {
	const arrays = columns.map(([, type], i) => `$${first + i}::${type}[]`).join(", ");
	const names = [...columns.map(([name]) => name), ...(ordinality ? [ordinality] : [])];
	return `unnest(${arrays})${ordinality ? " WITH ORDINALITY" : ""} AS ${alias}(${names.join(", ")})`;
}

/** A value of a column that travels in an array: text, integer or boolean, or NULL. */
export type ArrayElement = string | number | boolean | null | undefined;

// In a JSON text every backslash starts an escape; this finds one other than \" or \\ (and an
// escaped backslash before a letter, whose string then only takes the slower path).
const ESCAPE_PG_READS_OTHERWISE = /\\[^"\\]/;
const QUOTE_OR_BACKSLASH = /["\\]/g;

/**
 * A PostgreSQL array literal (`{"a","b\"c",NULL,1,true}`) of the values, for a `$n::type[]`
 * parameter. pg builds one from a JS array element by element, two regex replaces and a
 * concatenation each: with the writes of those concatenated strings, a quarter of a dispatcher's
 * main thread in a burst. JSON.stringify writes the same text natively whenever the only escapes
 * it makes are \" and \\, which the array syntax reads alike, and its null is the array's NULL.
 * A string with a control character or a lone surrogate (JSON escapes those as \n or \uXXXX,
 * which the array syntax would read as "n" or "uXXXX") is quoted element by element instead.
 * Numbers here are integers (JSON would write a NaN as null).
 */
export function arrayLiteral(values: readonly ArrayElement[]): string {
	const json = JSON.stringify(values);
	if (!ESCAPE_PG_READS_OTHERWISE.test(json)) return `{${json.slice(1, -1)}}`;
	return `{${values.map(value => (value == null ? "NULL" : typeof value === "string" ? `"${value.replace(QUOTE_OR_BACKSLASH, "\\$&")}"` : String(value))).join(",")}}`;
}

/** The values for unnestColumns: one array literal per column, in the same order. */
export function columnArrays<Row>(rows: Row[], columns: ReadonlyArray<(row: Row) => ArrayElement>): string[] {
	return columns.map(valueOf => arrayLiteral(rows.map(valueOf)));
}
