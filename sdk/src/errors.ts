// Every answer other than 2xx becomes an ApiError (or one of its subclasses, by status) that
// carries the problem details the API sent (RFC 9457).
import type { FieldProblem, Problem } from "./api-types";

export class ApiError extends Error {
	readonly status: number;
	readonly type: string;
	readonly title: string;
	readonly detail: string;
	/** 422 only: one entry per problem found, `path` naming the field (e.g. `events[0]`). */
	readonly errors: FieldProblem[];
	/** The X-Request-Id of the failed request, to quote when asking for help. */
	readonly requestId: string | undefined;

	constructor(problem: Problem, requestId?: string) {
		super(`${problem.status} ${problem.title}: ${problem.detail}`);
		this.name = new.target.name;
		this.status = problem.status;
		this.type = problem.type;
		this.title = problem.title;
		this.detail = problem.detail;
		this.errors = problem.errors ?? [];
		this.requestId = requestId;
	}

	/** The problem details as the API sent them. */
	toProblem(): Problem {
		return { type: this.type, title: this.title, status: this.status, detail: this.detail, ...(this.errors.length ? { errors: this.errors } : {}) };
	}
}

export class BadRequestError extends ApiError {}
export class AuthenticationError extends ApiError {}
export class NotFoundError extends ApiError {}
export class ConflictError extends ApiError {}
export class PreconditionFailedError extends ApiError {}
export class PayloadTooLargeError extends ApiError {}
export class UnsupportedMediaTypeError extends ApiError {}
export class ValidationError extends ApiError {}
export class ServiceUnavailableError extends ApiError {}
/** 403: the token lacks a scope the operation needs (events:publish). */
export class ForbiddenError extends ApiError {}

export class RateLimitError extends ApiError {
	/** Seconds the API asked to wait (Retry-After), when it said. */
	readonly retryAfterSeconds: number | undefined;

	constructor(problem: Problem, requestId: string | undefined, retryAfterSeconds: number | undefined) {
		super(problem, requestId);
		this.retryAfterSeconds = retryAfterSeconds;
	}
}

const BY_STATUS: Record<number, new (problem: Problem, requestId?: string) => ApiError> = {
	400: BadRequestError,
	401: AuthenticationError,
	403: ForbiddenError,
	404: NotFoundError,
	409: ConflictError,
	412: PreconditionFailedError,
	413: PayloadTooLargeError,
	415: UnsupportedMediaTypeError,
	422: ValidationError,
	503: ServiceUnavailableError,
};

function isProblem(value: unknown): value is Problem {
	const candidate = value as Partial<Problem> | null;
	return typeof candidate === "object" && candidate !== null && typeof candidate.status === "number" && typeof candidate.title === "string";
}

/** Builds the error for a failed answer; a body that is not problem+json still gets a typed error. */
export function errorFromResponse(status: number, statusText: string, body: unknown, requestId: string | undefined, retryAfterSeconds?: number): ApiError {
	const problem: Problem = isProblem(body)
		? { type: body.type ?? "about:blank", title: body.title, status, detail: body.detail ?? body.title, ...(Array.isArray(body.errors) ? { errors: body.errors } : {}) }
		: { type: "about:blank", title: statusText || `HTTP ${status}`, status, detail: typeof body === "string" && body ? body.slice(0, 500) : `The API answered ${status}` };
	if (status === 429) return new RateLimitError(problem, requestId, retryAfterSeconds);
	const Kind = BY_STATUS[status] ?? ApiError;
	return new Kind(problem, requestId);
}

/** A delivery that fails verification: bad or missing signature, stale timestamp, unparsable body. */
export class WebhookVerificationError extends Error {
	constructor(message: string) {
		super(message);
		this.name = "WebhookVerificationError";
	}
}

/**
 * A genuine delivery (its signature checked) whose body fails the checks verifyWebhook was asked
 * for: an unexpected or unknown type, or `data` that does not match its type's schema.
 */
export class WebhookPayloadError extends WebhookVerificationError {
	/** One entry per problem: a JSON Pointer into the body (e.g. `/data/status`) and what is wrong. */
	readonly problems: Array<{ path: string; message: string }>;

	constructor(message: string, problems: Array<{ path: string; message: string }>) {
		super(message);
		this.name = "WebhookPayloadError";
		this.problems = problems;
	}
}
