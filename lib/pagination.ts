// Keyset pagination with opaque tokens: stable under inserts, no OFFSET scans.
import { invalidField } from "./errors";

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
		const parsed: unknown = JSON.parse(Buffer.from(token, "base64url").toString("utf8"));
		if (Array.isArray(parsed) && parsed.length === 2 && typeof parsed[0] === "string" && typeof parsed[1] === "string") {
			return { at: parsed[0], id: parsed[1] };
		}
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
