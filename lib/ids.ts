// Time-ordered ids (UUID version 7, RFC 9562): 48 bits of Unix milliseconds, then random bits.
// Rows written together get neighbouring keys, so inserting a burst of them touches a few B-tree
// pages instead of one random page per row in every index on the id; on the embedded SQLite
// writer that more than halves the cost of an insert-heavy transaction.
//
// Within one process the ids also strictly increase (RFC 9562, 6.2, method 1): the 12 bits after
// the version count up within a millisecond, from a random start below half their range, and a
// count that runs out moves on to the next millisecond. The delivery log sorts rows of the same
// millisecond by id, so without the count two events written in one millisecond were listed in
// either order.
import crypto from "node:crypto";

const COUNTER_LIMIT = 0xfff;
let lastMs = -1;
let counter = 0;
// The id's first 15 characters (its time and version) for lastMs: a burst makes tens of ids a
// millisecond, and writing a 48-bit number in hex is the costliest step of making one.
let timePrefixMs = -1;
let timePrefix = "";

function prefixFor(ms: number): string {
	if (ms !== timePrefixMs) {
		const time = ms.toString(16).padStart(12, "0");
		timePrefix = `${time.slice(0, 8)}-${time.slice(8, 12)}-7`;
		timePrefixMs = ms;
	}
	return timePrefix;
}

export function timeOrderedUuid(now = Date.now()): string {
	// randomUUID draws from a pooled random buffer: much cheaper than randomBytes per id. Its
	// version nibble and counter field are replaced and its (RFC 9562) variant bits are kept.
	const random = crypto.randomUUID();
	if (now === lastMs || (now < lastMs && lastMs - now < 1_000)) {
		// The same millisecond, or a clock that stepped back a little: keep counting from the last id.
		counter += 1;
		if (counter > COUNTER_LIMIT) {
			lastMs += 1;
			counter = 0;
		}
	} else {
		lastMs = now;
		counter = parseInt(random.slice(15, 18), 16) & 0x7ff;
	}
	return `${prefixFor(lastMs)}${counter.toString(16).padStart(3, "0")}${random.slice(18)}`;
}

/** When a time-ordered id was made (Unix ms), or null for an id of another version. */
export function timeOfOrderedUuid(id: string): number | null {
	const match = /^([0-9a-f]{8})-([0-9a-f]{4})-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$/i.exec(id);
	return match ? parseInt(match[1] + match[2], 16) : null;
}
