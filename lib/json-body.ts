// Checks on a JSON request body's text that JSON.parse cannot make: it is read as UTF-8 whatever
// the bytes (invalid sequences silently become U+FFFD), and a repeated key keeps its last value
// without a word, so a proxy or a log that reads the first one would see another request.
import { isUtf8 } from "node:buffer";

export class JsonBodyProblem extends Error {}

/** Throws JsonBodyProblem when the body is not UTF-8, or when one object repeats a key. */
export function checkJsonBody(bytes: Buffer): void {
	if (!isUtf8(bytes)) throw new JsonBodyProblem("The body is not valid UTF-8 JSON");
	const key = repeatedKey(bytes.toString("utf8"));
	if (key !== undefined) throw new JsonBodyProblem(`The body repeats the key ${JSON.stringify(key)} in one object: send each key once`);
}

/**
 * The first key that appears twice in one object, compared as decoded strings ("a" and "\u0061"
 * are one key). Text that is not JSON gets undefined: the parser then refuses it on its own.
 */
export function repeatedKey(text: string): string | undefined {
	// One entry per open container: the keys seen (objects) or null (arrays).
	const open: Array<Set<string> | null> = [];
	let expectingKey = false;
	for (let i = 0; i < text.length; i++) {
		const char = text[i];
		if (char === '"') {
			const end = stringEnd(text, i);
			if (end < 0) return undefined;
			const keys = open.at(-1);
			if (expectingKey && keys) {
				let key: string;
				try {
					key = JSON.parse(text.slice(i, end + 1)) as string;
				} catch {
					return undefined;
				}
				if (keys.has(key)) return key;
				keys.add(key);
				expectingKey = false;
			}
			i = end;
		} else if (char === "{") {
			open.push(new Set());
			expectingKey = true;
		} else if (char === "[") {
			open.push(null);
			expectingKey = false;
		} else if (char === "}" || char === "]") {
			open.pop();
			expectingKey = false;
		} else if (char === ",") {
			expectingKey = open.at(-1) instanceof Set;
		}
	}
	return undefined;
}

/** The index of the quote closing the string that opens at `start`, or -1. */
function stringEnd(text: string, start: number): number {
	for (let i = start + 1; i < text.length; i++) {
		if (text[i] === "\\") i++;
		else if (text[i] === '"') return i;
	}
	return -1;
}
