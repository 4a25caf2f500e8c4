// What the gateway accepts from a request before any action sees it: the request id, the CORS
// origin, and where each action parameter may come from (the path, the documented query
// parameters, the body). Pure functions: services/api.service.ts applies them.
import crypto from "node:crypto";
import { UnprocessableError, type FieldProblem } from "./errors";

const SAFE_REQUEST_ID = /^[A-Za-z0-9._-]{1,64}$/;

/** An incoming X-Request-Id is kept only if short and plain; otherwise a fresh one is made. */
export function requestIdFrom(incoming: string | string[] | undefined): string {
	const candidate = Array.isArray(incoming) ? incoming[0] : incoming;
	return typeof candidate === "string" && SAFE_REQUEST_ID.test(candidate) ? candidate : crypto.randomUUID();
}

/** Headers a browser may send to /id/v3 from an allowed origin, and those it may read back. */
export const CORS_ALLOWED_HEADERS = ["Authorization", "Content-Type", "If-Match", "X-Request-Id"];
export const CORS_EXPOSED_HEADERS = ["ETag", "Location", "Retry-After", "X-Request-Id", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"];
export const CORS_MAX_AGE_SECONDS = 600;

export function originAllowed(origin: string | undefined, allowed: readonly string[]): origin is string {
	return typeof origin === "string" && (allowed.includes("*") || allowed.includes(origin));
}

export type QueryValues = Record<string, string | string[]>;

/**
 * The query string as plain strings: a repeated name becomes a list, and names such as
 * "per_page[]" or "__proto__" stay names (no nesting, no prototype), so they can be refused.
 */
export function parseQuery(search: string): QueryValues {
	const query: QueryValues = Object.create(null);
	for (const [name, value] of new URLSearchParams(search)) {
		const previous = query[name];
		query[name] = previous === undefined ? value : [...(Array.isArray(previous) ? previous : [previous]), value];
	}
	return query;
}

export interface RequestParts {
	body: unknown;
	query: QueryValues | undefined;
	path: Record<string, string> | undefined;
}

/** Sets a key as a plain own property: "__proto__" must stay data, never become a prototype. */
function put(target: Record<string, unknown>, key: string, value: unknown): void {
	Object.defineProperty(target, key, { value, enumerable: true, writable: true, configurable: true });
}

/**
 * The flat params an action receives. Body fields come from the body only, query parameters
 * only if the route documents them, path parameters from the path; a name sent in two places
 * or an undocumented query parameter is a 422, so nothing can stand in for a body field.
 */
export function actionParams(parts: RequestParts, documentedQuery: readonly string[]): Record<string, unknown> {
	const params: Record<string, unknown> = {};
	const problems: FieldProblem[] = [];
	const body = parts.body && typeof parts.body === "object" && !Array.isArray(parts.body) ? (parts.body as Record<string, unknown>) : {};
	for (const key of Object.keys(body)) put(params, key, body[key]);

	for (const [name, value] of Object.entries(parts.query ?? {})) {
		if (!documentedQuery.includes(name)) {
			const accepted = documentedQuery.length ? `this route accepts only ${documentedQuery.join(", ")}` : "this route takes no query parameters";
			problems.push({ path: name, message: `is not a query parameter of this route: ${accepted}` });
		} else if (Array.isArray(value)) {
			problems.push({ path: name, message: "must be given once" });
		} else if (Object.hasOwn(params, name)) {
			problems.push({ path: name, message: "was sent both in the query string and in the body: send it once" });
		} else put(params, name, value);
	}
	for (const [name, value] of Object.entries(parts.path ?? {})) {
		if (Object.hasOwn(body, name)) problems.push({ path: name, message: "comes from the URL path, not the body: remove it from the body" });
		put(params, name, value);
	}
	if (problems.length) {
		throw new UnprocessableError(problems.map(problem => `${problem.path}: ${problem.message}`).join("; "), problems);
	}
	return params;
}

// Headers that must appear once: with two, Node keeps one and a proxy in front may use the other
// (two Authorization headers: the gateway and the proxy would see different users).
const SINGLE_HEADERS = new Set(["authorization", "host", "content-type", "content-length", "if-match", "origin", "x-request-id", "x-correlation-id"]);

/**
 * Why the gateway cannot trust how this request is framed or addressed, or undefined; the
 * connection is closed after the answer. A transfer coding other than plain chunked leaves the
 * body's end unknown (RFC 9112 §6.1), an HTTP/1.1 request must name its Host, and a header that
 * must appear once must not repeat.
 */
export function framingProblem(request: { httpVersion: string; headers: Record<string, string | string[] | undefined>; rawHeaders: string[] }): string | undefined {
	const transferEncoding = request.headers["transfer-encoding"];
	if (transferEncoding !== undefined) {
		const codings = String(transferEncoding)
			.split(",")
			.map(coding => coding.trim().toLowerCase());
		if (codings.length !== 1 || codings[0] !== "chunked") {
			return `Transfer-Encoding "${transferEncoding}" is not supported: send the body with Content-Length or Transfer-Encoding: chunked`;
		}
	}
	if (request.httpVersion === "1.1" && request.headers.host === undefined) return "An HTTP/1.1 request must carry a Host header";
	const seen = new Set<string>();
	for (let i = 0; i < request.rawHeaders.length; i += 2) {
		const name = request.rawHeaders[i].toLowerCase();
		if (!SINGLE_HEADERS.has(name)) continue;
		if (seen.has(name)) return `The ${request.rawHeaders[i]} header must be sent once`;
		seen.add(name);
	}
	return undefined;
}
