// Strong entity tags derived from a response body, and the If-Match check of RFC 9110 §13.1.1.
// Deriving the tag from the body means any change a client could see changes the tag, with no
// version column to keep in step.
import crypto from "node:crypto";

/** A strong ETag (`"…"`) for a JSON-serialisable body. Equal bodies give equal tags. */
export function strongEtag(body: unknown): string {
	const digest = crypto.createHash("sha256").update(JSON.stringify(body)).digest("base64url");
	return `"${digest.slice(0, 32)}"`;
}

/**
 * Whether an If-Match header value lets a change go ahead, given the current tag.
 * `*` matches any current representation. Otherwise it is a comma-separated list of tags,
 * compared strongly: a weak tag (`W/"…"`) or an unquoted value never matches.
 */
export function ifMatchSatisfied(header: string, currentEtag: string): boolean {
	const candidates = header
		.split(",")
		.map(part => part.trim())
		.filter(Boolean);
	if (candidates.includes("*")) return true;
	return candidates.includes(currentEtag);
}
