// Small helpers for hand-written SQL that runs on both engines.

/** knex.raw answers rows on SQLite and a pg Result on PostgreSQL. */
export function rowsOf<Row>(result: unknown): Row[] {
	return Array.isArray(result) ? (result as Row[]) : ((result as { rows: Row[] }).rows ?? []);
}

/** Splits rows into groups of `size`, e.g. to stay below the engines' bind-variable limits. */
export function chunks<T>(items: T[], size: number): T[][] {
	const out: T[][] = [];
	for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
	return out;
}
