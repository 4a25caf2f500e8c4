// What every part of the OpenAPI document shares: the JSON Schema type zod produces, references
// to the named schemas under components.schemas, and the cleanup that makes a zod-made schema
// embeddable in the document, and the opening that lets a reader tolerate fields added later.

export type JsonSchema = Record<string, unknown>;

export const SCHEMA_REF = (name: string) => `#/components/schemas/${name}`;

export function withoutMetaKeys(schema: JsonSchema): JsonSchema {
	const { $schema: _schema, $id: _id, ...rest } = schema;
	return rest;
}

/** Answers and delivered bodies tolerate additions: a reader should ignore fields it does not know. */
export function openForAdditions(value: unknown): unknown {
	if (Array.isArray(value)) return value.map(openForAdditions);
	if (!value || typeof value !== "object") return value;
	const entries = Object.entries(value).filter(([key, child]) => !(key === "additionalProperties" && child === false));
	return Object.fromEntries(entries.map(([key, child]) => [key, openForAdditions(child)]));
}
