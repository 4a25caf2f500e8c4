// Turns one entry of the route table into an OpenAPI operation object. moleculer-web merges path,
// query and body into one params object, so this splits the action's params schema again: path
// placeholders become path parameters, the rest become query parameters (GET, DELETE) or the JSON
// body (POST, PUT, PATCH).
import { z } from "zod";
import { QUERY_INTEGERS } from "../schemas/common";
import { type JsonSchema, SCHEMA_REF, withoutMetaKeys } from "./json-schema";
import { type Operation, OPERATIONS } from "./operations";

function inputSchema(schema: z.ZodType): { properties: Record<string, JsonSchema>; required: string[]; rest: JsonSchema } {
	// Query integers are documented as the integers they stand for, with their default.
	const override = ({ zodSchema, jsonSchema }: { zodSchema: unknown; jsonSchema: JsonSchema }) => {
		const def = (zodSchema as { _zod: { def: { type: string; innerType?: z.ZodType; defaultValue?: unknown } } })._zod.def;
		const documented = QUERY_INTEGERS.get((def.type === "default" ? def.innerType : zodSchema) as z.ZodType);
		if (!documented) return;
		delete jsonSchema.anyOf;
		Object.assign(jsonSchema, documented, def.type === "default" ? { default: def.defaultValue } : {});
	};
	const json = withoutMetaKeys(z.toJSONSchema(schema, { io: "input", unrepresentable: "any", override }) as JsonSchema);
	const { properties = {}, required = [], ...rest } = json as { properties?: Record<string, JsonSchema>; required?: string[] };
	return { properties, required, rest };
}

function responseSchema(schema: Operation["success"]["schema"]): JsonSchema | undefined {
	if (!schema) return undefined;
	if (typeof schema === "string") return { $ref: SCHEMA_REF(schema) };
	return { type: "array", items: { $ref: SCHEMA_REF(schema.arrayOf) } };
}

const hasBody = (operation: Operation) => ["post", "put", "patch"].includes(operation.method);
const pathNamesOf = (operation: Operation) => [...operation.path.matchAll(/\{(\w+)\}/g)].map(match => match[1]);
const inputOf = (schema: z.ZodType | undefined) => (schema ? inputSchema(schema) : { properties: {}, required: [], rest: {} });

/**
 * Where the query parameters of an operation are declared: the action's params minus the path
 * for an operation without a body, or a separate schema next to a body.
 */
function queryInput(operation: Operation): { properties: Record<string, JsonSchema>; required: string[] } {
	if (hasBody(operation)) return inputOf(operation.query);
	const input = inputOf(operation.params);
	const pathNames = pathNamesOf(operation);
	const names = Object.keys(input.properties).filter(name => !pathNames.includes(name) && !operation.hiddenFields?.includes(name));
	return { properties: Object.fromEntries(names.map(name => [name, input.properties[name]])), required: input.required };
}

/** The documented query parameters of each action reached over HTTP: the gateway refuses any other. */
export function queryParametersByAction(): Map<string, string[]> {
	return new Map(OPERATIONS.map(operation => [operation.action, Object.keys(queryInput(operation).properties)]));
}

export function buildOperation(operation: Operation): JsonSchema {
	const pathNames = pathNamesOf(operation);
	const input = inputOf(operation.params);
	const parameters: JsonSchema[] = pathNames.map(name => ({
		name,
		in: "path",
		required: true,
		schema: input.properties[name] ?? { type: "string" },
	}));
	const bodyFields = Object.keys(input.properties).filter(name => !pathNames.includes(name) && !operation.hiddenFields?.includes(name));
	const hasJsonBody = hasBody(operation);
	const query = queryInput(operation);
	for (const [name, property] of Object.entries(query.properties)) {
		const { description, ...schema } = property;
		parameters.push({ name, in: "query", required: query.required.includes(name), schema, ...(description ? { description } : {}) });
	}
	if (operation.ifMatch) {
		parameters.push({ name: "If-Match", in: "header", required: false, schema: { type: "string" }, description: "The ETag last read: the update is refused with 412 if the record changed since" });
	}

	let requestBody: JsonSchema | undefined;
	if (operation.jsonBody) {
		requestBody = { required: true, content: { "application/json": { schema: withoutMetaKeys(z.toJSONSchema(operation.jsonBody, { io: "input", unrepresentable: "any" }) as JsonSchema) } } };
	} else if (operation.formBody) {
		requestBody = { required: true, content: { "application/x-www-form-urlencoded": { schema: withoutMetaKeys(z.toJSONSchema(operation.formBody, { io: "input" }) as JsonSchema) } } };
	} else if (hasJsonBody && bodyFields.length > 0) {
		const required = input.required.filter(name => bodyFields.includes(name));
		const schema = {
			...input.rest,
			properties: Object.fromEntries(bodyFields.map(name => [name, input.properties[name]])),
			...(required.length ? { required } : {}),
		};
		requestBody = { required: true, content: { "application/json": { schema } } };
	}

	const { success } = operation;
	const successSchema = responseSchema(success.schema);
	const responses: Record<string, JsonSchema> = {
		[String(success.status)]: {
			description: success.description,
			...(success.headers ? { headers: Object.fromEntries(Object.entries(success.headers).map(([name, description]) => [name, { description, schema: { type: "string" } }])) } : {}),
			...(success.html ? { content: { "text/html": { schema: { type: "string" } } } } : {}),
			...(successSchema ? { content: { "application/json": { schema: successSchema } } } : {}),
		},
	};
	for (const status of [...new Set(operation.errors)].sort()) responses[String(status)] = { $ref: `#/components/responses/Problem${status}` };
	for (const [status, description] of Object.entries(operation.htmlErrors ?? {})) {
		responses[status] = { description, content: { "text/html": { schema: { type: "string" } } } };
	}

	return {
		operationId: operation.action.replace(".", "_"),
		summary: operation.summary,
		...(operation.description ? { description: operation.description } : {}),
		tags: [operation.tag],
		"x-moleculer-action": operation.action,
		...(operation.public ? { security: [] } : {}),
		...(parameters.length ? { parameters } : {}),
		...(requestBody ? { requestBody } : {}),
		responses,
	};
}
