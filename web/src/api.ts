// The app's only way to the server: same-origin fetch under /id/v3 with the bearer token, and
// RFC 9457 problem details turned into ApiError so that forms can place each message.
import type { FieldProblem, Problem } from "./types";

export class ApiError extends Error {
	constructor(
		readonly status: number,
		readonly problem: Problem,
	) {
		super(problem.detail || problem.title);
	}

	/** The messages for one field: errors whose path is the field or starts with it (events[0]). */
	forField(field: string): string[] {
		return (this.problem.errors ?? []).filter(error => pathMatches(error.path, field)).map(error => error.message);
	}
}

function pathMatches(path: string, field: string): boolean {
	return path === field || path.startsWith(`${field}[`) || path.startsWith(`${field}.`);
}

/** Errors not tied to any of the given fields, to show at the top of the form. */
export function unplacedErrors(error: ApiError, fields: string[]): FieldProblem[] {
	return (error.problem.errors ?? []).filter(item => item.path !== "" && !fields.some(field => pathMatches(item.path, field)));
}

export interface ApiResponse<T> {
	body: T;
	headers: Headers;
}

type Unauthorized = (error: ApiError) => void;

export class Api {
	constructor(
		private readonly base: string,
		private readonly token: string,
		private readonly onUnauthorized: Unauthorized,
	) {}

	async send<T>(method: string, path: string, options: { body?: unknown; headers?: Record<string, string> } = {}): Promise<ApiResponse<T>> {
		const headers: Record<string, string> = { Accept: "application/json", Authorization: `Bearer ${this.token}`, ...options.headers };
		if (options.body !== undefined) headers["Content-Type"] = "application/json";
		let response: Response;
		try {
			response = await fetch(this.base + path, { method, headers, body: options.body === undefined ? undefined : JSON.stringify(options.body) });
		} catch {
			throw new ApiError(0, { type: "urn:problem:network", title: "Network error", status: 0, detail: "The service could not be reached. Check your connection and try again." });
		}
		const text = await response.text();
		let body: unknown = undefined;
		try {
			body = text ? JSON.parse(text) : undefined;
		} catch {
			body = undefined;
		}
		if (!response.ok) {
			const problem =
				body && typeof body === "object" && "status" in body
					? (body as Problem)
					: { type: "about:blank", title: response.statusText || "Error", status: response.status, detail: `The service answered ${response.status}.` };
			const error = new ApiError(response.status, problem);
			if (response.status === 401) this.onUnauthorized(error);
			throw error;
		}
		return { body: body as T, headers: response.headers };
	}

	get<T>(path: string) {
		return this.send<T>("GET", path).then(response => response.body);
	}
	post<T>(path: string, body?: unknown) {
		return this.send<T>("POST", path, { body }).then(response => response.body);
	}
	patch<T>(path: string, body: unknown) {
		return this.send<T>("PATCH", path, { body }).then(response => response.body);
	}
	delete(path: string) {
		return this.send<void>("DELETE", path).then(() => undefined);
	}
}
