// Zod validation for Moleculer actions.
//
// Moleculer deep-clones action definitions, which breaks zod 4 schema objects, so an action
// declares `params: zodParams(schema)`: a function that returns the schema survives the clone.
// The validator then hands zod's parsed output (defaults applied, strings trimmed) to the handler.
import { Errors, Validators, type ActionHandler, type ActionSchema, type Context } from "moleculer";
import type { z } from "zod";
import type { FieldProblem } from "../lib/errors";
import { issuesToProblems } from "../lib/zod-problems";

export const ZOD_SCHEMA = "$zodSchema";

export interface ZodParams {
	[key: string]: () => z.ZodType;
}

export function zodParams(schema: z.ZodType): ZodParams {
	return { [ZOD_SCHEMA]: () => schema };
}

export function validationError(error: z.ZodError): Errors.ValidationError {
	return new Errors.ValidationError("The request failed validation", "VALIDATION_ERROR", issuesToProblems(error) as unknown as object);
}

/** Parses with a zod schema or throws the Moleculer ValidationError the gateway maps to 422. */
export function parseOrThrow<T extends z.ZodType>(schema: T, input: unknown): z.output<T> {
	const result = schema.safeParse(input);
	if (!result.success) throw validationError(result.error);
	return result.data;
}

function schemaOf(params: unknown): z.ZodType | undefined {
	if (params && typeof params === "object" && typeof (params as ZodParams)[ZOD_SCHEMA] === "function") {
		return (params as ZodParams)[ZOD_SCHEMA]();
	}
	return undefined;
}

export class ZodValidator extends Validators.Base {
	override compile(params: unknown): (value: unknown) => true | FieldProblem[] {
		const schema = schemaOf(params);
		if (!schema) throw new Error("Action params must be declared with zodParams(schema)");
		return (value: unknown) => {
			const result = schema.safeParse(value);
			return result.success ? true : issuesToProblems(result.error);
		};
	}

	override validate(value: unknown, params: unknown): boolean {
		const schema = schemaOf(params);
		if (!schema) return true;
		parseOrThrow(schema, value);
		return true;
	}

	override convertSchemaToMoleculer(schema: unknown): Record<string, unknown> {
		return schema as Record<string, unknown>;
	}

	// moleculer's typings declare the wrong shape here: at run time a validator's middleware()
	// returns a middleware object with localAction/localEvent hooks, as below.
	override middleware(): (handler: ActionHandler, action: ActionSchema) => unknown {
		const wrap = (handler: (ctx: Context) => unknown, params: unknown) => {
			const schema = schemaOf(params);
			if (!schema) return handler;
			return function validateWithZod(ctx: Context) {
				const result = schema.safeParse(ctx.params ?? {});
				// Reject rather than throw: moleculer's context tracking only releases a context in
				// the promise's then/catch, so a synchronous throw would leak it and stall shutdown.
				if (!result.success) return Promise.reject(validationError(result.error));
				ctx.params = result.data;
				return handler(ctx);
			};
		};
		const hooks = {
			name: "ZodValidator",
			localAction: (handler: (ctx: Context) => unknown, action: { params?: unknown }) => wrap(handler, action.params),
			localEvent: (handler: (ctx: Context) => unknown, event: { params?: unknown }) => wrap(handler, event.params),
		};
		return hooks as unknown as (handler: ActionHandler, action: ActionSchema) => unknown;
	}
}
