// HTTP load with autocannon: keep-alive connections, no pipelining, a short warm-up (so that the
// JIT and connection pools are settled) before the measured run.
import autocannon from "autocannon";
import { round } from "./stats";

export interface LoadOptions {
	url: string;
	method?: "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
	headers?: Record<string, string>;
	/** A fixed body, or a function called for every request (unique names, URLs). */
	body?: string | (() => string);
	connections: number;
	durationSeconds: number;
	warmupSeconds: number;
}

export interface LoadFigures {
	requests_per_second: number;
	latency_ms: { p50: number; p90: number; p99: number; max: number };
	requests: number;
	non_2xx: number;
	errors: number;
	timeouts: number;
	status_codes: Record<string, number>;
}

async function fire(options: LoadOptions, durationSeconds: number): Promise<autocannon.Result> {
	const { body } = options;
	return autocannon({
		url: options.url,
		method: options.method ?? "GET",
		headers: options.headers,
		// autocannon's own idReplacement sent nothing at all in our check (autocannon 8), so a
		// per-request body goes through setupRequest instead.
		...(typeof body === "function" ? { requests: [{ setupRequest: request => ({ ...request, body: body() }) }] } : { body }),
		connections: options.connections,
		pipelining: 1,
		duration: durationSeconds,
		timeout: 10,
	});
}

export async function measureLoad(options: LoadOptions): Promise<LoadFigures> {
	if (options.warmupSeconds > 0) await fire(options, options.warmupSeconds);
	const result = await fire(options, options.durationSeconds);
	const statusCodes = Object.fromEntries(
		Object.entries(result.statusCodeStats ?? {}).map(([code, stats]) => [code, (stats as { count: number }).count]),
	);
	return {
		requests_per_second: round(result.requests.average, 1),
		latency_ms: { p50: result.latency.p50, p90: result.latency.p90, p99: result.latency.p99, max: result.latency.max },
		requests: result.requests.total,
		non_2xx: result.non2xx,
		errors: result.errors,
		timeouts: result.timeouts,
		status_codes: statusCodes,
	};
}
