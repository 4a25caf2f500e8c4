// Keyset pagination with opaque tokens: stable under inserts, no OFFSET scans.
import { z } from "zod";
import { invalidField } from "./errors";

// Every list paged here is of rows with UUID ids (webhooks, deliveries); on PostgreSQL a delivery's
// id is a uuid column, where any other text in the token would be a database error, not a 422.
const CursorFields = z.tuple([z.string().max(40), z.uuid()]);

export interface Cursor {
	/** ISO timestamp of the last row returned. */
	at: string;
	/** id of the last row returned: breaks ties between equal timestamps. */
	id: string;
}

export function encodeCursor(cursor: Cursor): string {
	return Buffer.from(JSON.stringify([cursor.at, cursor.id]), "utf8").toString("base64url");
}

export function decodeCursor(token: string | undefined): Cursor | undefined {
	if (token === undefined) return undefined;
	try {
		const parsed = CursorFields.safeParse(JSON.parse(Buffer.from(token, "base64url").toString("utf8")));
		if (parsed.success) return { at: parsed.data[0], id: parsed.data[1] };
	} catch {
		// fall through to the validation error below
	}
	throw invalidField("token", "is not a valid page token");
}

export interface Page<T> {
	items: T[];
	context: { per_page: number; matched: number; returned: number };
	links: Array<{ rel: "next"; href: string; method: "GET" }>;
}

/**
 * Builds the page envelope from rows fetched with `limit = perPage + 1`: the extra row only
 * tells us whether a next page exists. `nextHref` receives the token for that page.
 */
export function buildPage<Row extends { id: string }, T>(
	rows: Row[],
	perPage: number,
	matched: number,
	cursorOf: (row: Row) => Cursor,
	present: (row: Row) => T,
	nextHref: (token: string) => string,
): Page<T> {
	const visible = rows.slice(0, perPage);
	const items = visible.map(present);
	const links: Page<T>["links"] = [];
	if (rows.length > perPage && visible.length > 0) {
		links.push({ rel: "next", href: nextHref(encodeCursor(cursorOf(visible[visible.length - 1]))), method: "GET" });
	}
	return { items, context: { per_page: perPage, matched, returned: items.length }, links };
}
