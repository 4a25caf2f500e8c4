// zod's issues in our words: one problem per field, at a path a client can point at. Used by the
// actions' validator (mixins/validation.ts) and by pure helpers that check a body themselves.
import type { z } from "zod";
import type { FieldProblem } from "./errors";

/** Renders a zod path as `events[0]` / `notifications[1].settings[0].email`. */
export function formatIssuePath(path: ReadonlyArray<PropertyKey>): string {
	return path.reduce<string>((text, key) => (typeof key === "number" ? `${text}[${key}]` : text ? `${text}.${String(key)}` : String(key)), "");
}

export function issuesToProblems(error: z.ZodError): FieldProblem[] {
	return error.issues.flatMap(issue => {
		// zod reports unknown keys on the object; give each key its own entry, at its own path,
		// so a client can point at the field to drop.
		if (issue.code === "unrecognized_keys") {
			const keys = (issue as { keys: string[] }).keys;
			return keys.map(key => ({ path: formatIssuePath([...issue.path, key]), message: "is not a known field" }));
		}
		return [{ path: formatIssuePath(issue.path), message: issue.message }];
	});
}
