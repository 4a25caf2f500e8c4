// Schemas shared by several resources: ids, paging, names that people read.
import { z } from "zod";

export const uuid = z.uuid({ message: "must be a UUID" });

const LONE_SURROGATE = /\p{Cs}/u;
// Control characters, invisible format characters (zero-width spaces and joiners, bidi
// overrides and isolates, soft hyphen, BOM) and line/paragraph separators: they let two names
// that look the same differ, or make a name display as something else.
const HIDDEN_CHARACTER = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/u;

/** True when the string is valid Unicode: no UTF-16 surrogate without its pair. */
export function isWellFormedText(text: string): boolean {
	return !LONE_SURROGATE.test(text);
}

/** Why a name people will read is refused, or undefined when it is fine. */
export function displayTextProblem(text: string): string | undefined {
	if (!isWellFormedText(text)) return "is not valid Unicode text (it holds a lone UTF-16 surrogate)";
	const hidden = HIDDEN_CHARACTER.exec(text)?.[0];
	if (hidden === undefined) return undefined;
	const code = `U+${hidden.codePointAt(0)!.toString(16).toUpperCase().padStart(4, "0")}`;
	return /\p{Cc}/u.test(hidden)
		? `must not contain control characters (found ${code})`
		: `must not contain invisible formatting characters such as zero-width or bidirectional marks (found ${code})`;
}

/**
 * The form a name is stored and compared in: Unicode NFKC, so that composed and decomposed
 * accents, full-width letters, ligatures and the no-break or em space are the plain character
 * they look like, with each run of spaces folded into one. Letters of different scripts that
 * look alike (Greek capital alpha, Latin A) stay apart: telling them together takes a table of
 * confusables, would merge real names in those scripts, and a name is a label the customer who
 * owns every one of its webhooks reads, never a credential.
 */
export function comparableName(text: string): string {
	return text.normalize("NFKC").replace(/\s+/gu, " ").trim();
}

/**
 * A name people read and compare: without hidden characters, then stored in its comparable form
 * (comparableName), so that look-alike spellings are one name.
 */
export function displayName(max: number) {
	return z
		.string()
		.trim()
		.check(context => {
			const problem = displayTextProblem(context.value);
			if (problem) context.issues.push({ code: "custom", message: problem, input: context.value });
		})
		.overwrite(comparableName)
		.min(1, "must not be empty")
		.max(max, `must be at most ${max} characters`);
}

/**
 * A whole number from the query string: decimal digits only, so "0x10", "1e1", " 5" and "+5"
 * are refused rather than read as numbers. Internal callers may pass a number.
 */
export function queryInteger(min: number, max: number) {
	const message = `must be a whole number from ${min} to ${max}, in decimal digits`;
	const schema = z
		.union([z.int(), z.string().regex(/^[0-9]{1,15}$/).transform(Number)], { error: message })
		.pipe(z.number().min(min, message).max(max, message));
	QUERY_INTEGERS.set(schema, { type: "integer", minimum: min, maximum: max });
	return schema;
}

/** How a query integer is documented (lib/openapi/operation-object.ts): the union above is an implementation detail. */
export const QUERY_INTEGERS = new WeakMap<z.ZodType, { type: "integer"; minimum: number; maximum: number }>();

/** Query values arrive as strings; per_page is 1..100, default 25. */
export const PageQuery = z.object({
	per_page: queryInteger(1, 100).default(25),
	token: z.string({ message: "must be given once, as a string" }).max(512, "is not a valid page token").optional(),
});
export type PageQuery = z.infer<typeof PageQuery>;

export const PageContext = z.object({
	per_page: z.number().int(),
	matched: z.number().int(),
	returned: z.number().int(),
});

export const PageLink = z.object({
	rel: z.literal("next"),
	href: z.string(),
	method: z.literal("GET"),
});
