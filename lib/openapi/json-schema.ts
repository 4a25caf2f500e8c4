// What every part of the OpenAPI document shares: the JSON Schema type zod produces, references
// to the named schemas under components.schemas, and the cleanup that makes a zod-made schema
// embeddable in the document.

export type JsonSchema = Record<string, unknown>;

export const SCHEMA_REF = (name: string) => `#/components/schemas/${name}`;

export function withoutMetaKeys(schema: JsonSchema): JsonSchema {
	const { $schema: _schema, $id: _id, ...rest } = schema;
	return rest;
}
