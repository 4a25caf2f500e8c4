// Errors that services throw and the gateway turns into RFC 9457 problem details.
// Services speak in these classes; only the gateway knows about HTTP headers and bodies.
import { Errors } from "moleculer";

export interface FieldProblem {
	path: string;
	message: string;
}

const { MoleculerClientError } = Errors;

/** A client error with an HTTP-ish status code and a stable type slug. */
export class ClientProblem extends MoleculerClientError {
	constructor(status: number, slug: string, message: string, data?: unknown) {
		super(message, status, slug, data);
	}
}

export class NotFoundError extends ClientProblem {
	constructor(what = "Resource") {
		super(404, "not-found", `${what} not found`);
	}
}

export class ConflictError extends ClientProblem {
	constructor(message: string) {
		super(409, "conflict", message);
	}
}

export class PreconditionFailedError extends ClientProblem {
	constructor(message = "The resource has changed since it was read (ETag mismatch)") {
		super(412, "precondition-failed", message);
	}
}

/** 422 with the `errors` list that API.md asks for. */
export class UnprocessableError extends ClientProblem {
	constructor(message: string, errors: FieldProblem[]) {
		super(422, "validation-error", message, errors);
	}
}

/** 429, with the real wait until the caller's budget refills. */
export class RateLimitedError extends ClientProblem {
	constructor(readonly retryAfterSeconds: number) {
		super(429, "rate-limited", `Too many requests: try again in ${retryAfterSeconds} s`);
	}
}

/**
 * 503 with a detail written for the operation (what was or was not stored, what to do), where
 * the generic dependency-failure answer would say too little.
 */
export class UnavailableProblem extends ClientProblem {
	constructor(message: string) {
		super(503, "service-unavailable", message);
	}
}

export function invalidField(path: string, message: string): UnprocessableError {
	return new UnprocessableError(message, [{ path, message }]);
}

export interface Problem {
	type: string;
	title: string;
	status: number;
	detail: string;
	errors?: FieldProblem[];
	/** How many problems were found beyond the listed ones. */
	errors_omitted?: number;
}

/** A hostile body can hold thousands of problems: list the first ones and count the rest. */
export const MAX_LISTED_ERRORS = 50;
const MAX_DETAIL_LENGTH = 1_000;

const TITLES: Record<number, [slug: string, title: string]> = {
	400: ["invalid-json", "Bad Request"],
	401: ["unauthorized", "Unauthorized"],
	403: ["forbidden", "Forbidden"],
	404: ["not-found", "Not Found"],
	405: ["method-not-allowed", "Method Not Allowed"],
	408: ["request-timeout", "Request Timeout"],
	409: ["conflict", "Conflict"],
	412: ["precondition-failed", "Precondition Failed"],
	413: ["payload-too-large", "Payload Too Large"],
	415: ["unsupported-media-type", "Unsupported Media Type"],
	422: ["validation-error", "Unprocessable Content"],
	429: ["rate-limited", "Too Many Requests"],
	431: ["headers-too-large", "Request Header Fields Too Large"],
	500: ["internal", "Internal Server Error"],
	503: ["service-unavailable", "Service Unavailable"],
};

export const PROBLEM_TYPE_PREFIX = "urn:problem:";

// Error names and codes that mean "a dependency is down" rather than "our bug".
const UNAVAILABLE_NAMES = new Set([
	"ServiceNotFoundError",
	"ServiceUnavailableError",
	"ServiceNotAvailableError",
	"RequestTimeoutError",
	"BrokerDisconnectedError",
	"KnexTimeoutError",
	"QueueIsFullError",
]);
const UNAVAILABLE_CODES = new Set(["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EHOSTUNREACH", "ENOTFOUND", "57P01", "57P03", "SQLITE_BUSY", "SQLITE_CANTOPEN"]);

export function isDependencyFailure(err: unknown): boolean {
	if (!err || typeof err !== "object") return false;
	const candidate = err as { name?: string; code?: unknown; message?: string };
	if (candidate.name && UNAVAILABLE_NAMES.has(candidate.name)) return true;
	if (candidate.code === 503) return true;
	if (typeof candidate.code === "string" && UNAVAILABLE_CODES.has(candidate.code)) return true;
	return /Connection terminated|connect ECONNREFUSED|pool is probably full|database is locked/i.test(candidate.message ?? "");
}

function problem(status: number, detail: string, slug?: string, errors?: FieldProblem[]): Problem {
	const [defaultSlug, title] = TITLES[status] ?? TITLES[500];
	const shortDetail = detail.length > MAX_DETAIL_LENGTH ? `${detail.slice(0, MAX_DETAIL_LENGTH - 1)}…` : detail;
	const listed = errors && errors.length > MAX_LISTED_ERRORS ? { errors: errors.slice(0, MAX_LISTED_ERRORS), errors_omitted: errors.length - MAX_LISTED_ERRORS } : errors ? { errors } : {};
	return { type: PROBLEM_TYPE_PREFIX + (slug ?? defaultSlug), title, status, detail: shortDetail, ...listed };
}

/**
 * Whether a dependency failure happened after the request reached the dependency: a database
 * connection lost mid-query, or a call that timed out, may have been carried out (a COMMIT whose
 * answer never came back). A refused connection or an unreachable service means it was not.
 */
export function outcomeUnknown(err: unknown): boolean {
	if (!err || typeof err !== "object") return false;
	const candidate = err as { name?: string; code?: unknown; message?: string; syscall?: string };
	if (candidate.name === "RequestTimeoutError") return true;
	if (candidate.syscall === "connect" || /^connect /.test(candidate.message ?? "")) return false;
	if (candidate.code === "ECONNRESET" || candidate.code === "ETIMEDOUT" || candidate.code === "57P01") return true;
	return /Connection terminated|read ECONNRESET/i.test(candidate.message ?? "");
}

/**
 * Maps any error to a problem. Client errors keep their message; everything else becomes a
 * generic 500 or 503 so that no stack trace, SQL or host name reaches a client.
 */
export function toProblem(err: unknown): Problem {
	if (err instanceof UnavailableProblem) return problem(503, err.message, "service-unavailable");
	if (isDependencyFailure(err)) {
		// Never claim "nothing was changed" when the change may have been committed: a client
		// that trusts it and repeats a create gets a conflict with a webhook it never saw.
		return outcomeUnknown(err)
			? problem(503, "A dependency of this service became unavailable during the request. A change may or may not have been applied: check before repeating it.")
			: problem(503, "A dependency of this service is unavailable. Nothing was changed; try again shortly.");
	}
	const candidate = (err ?? {}) as { code?: unknown; type?: unknown; message?: string; data?: unknown; name?: string };
	const status = typeof candidate.code === "number" ? candidate.code : 500;
	if (status === 422 || candidate.name === "ValidationError") {
		const detail = candidate.message || "The request failed validation";
		const listed = Array.isArray(candidate.data) ? (candidate.data as FieldProblem[]).map(({ path, message }) => ({ path, message })) : [];
		return problem(422, detail, "validation-error", listed.length ? listed : [{ path: "", message: detail }]);
	}
	if (status >= 400 && status < 500 && TITLES[status]) {
		const slug = typeof candidate.type === "string" && /^[a-z][a-z-]*$/.test(candidate.type) ? candidate.type : undefined;
		return problem(status, candidate.message ?? TITLES[status][1], slug);
	}
	return problem(500, "An unexpected error occurred. It has been logged.");
}
