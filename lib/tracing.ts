// OpenTelemetry traces, off unless OTEL_EXPORTER_OTLP_ENDPOINT (or its _TRACES_ variant) is set.
// This module is all the rest of the code imports: with tracing off it loads nothing of
// OpenTelemetry, adds no middleware, and each helper below returns after one null check. The
// SDK and the spans live in lib/tracing-sdk.ts, loaded only when an endpoint is configured.
//
// One trace per event, across processes, in W3C trace context (`traceparent`):
//   HTTP request (its `traceparent` header, or a new trace)  -> ctx.meta.traceparent of every
//   Moleculer call and event it causes -> the JetStream message's headers (sendToChannel) ->
//   the consumer group's intake -> the column trace_context beside the persisted message (and
//   the outbox row) -> each attempt's span (and each email's), a child of that stored context,
//   however long after the event the attempt runs.
//
// The OpenTelemetry API is process-wide: the first app created in a process with an endpoint
// configures it, and later ones (tests, benchmarks) share it.
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Middleware } from "moleculer";
import type { AppConfig, ServiceName } from "./config";
import { ALL_SERVICES } from "./config";
import type { DeliveryOutcome } from "./webhook-sender";
import type { TracingRuntime } from "./tracing-sdk";

export type TraceSampler = AppConfig["OTEL_TRACES_SAMPLER"];

export interface TracingSettings {
	/** Where spans are POSTed: the traces endpoint itself, or the base endpoint + /v1/traces. */
	url: string;
	protocol: "http/protobuf" | "http/json";
	serviceName: string;
	sampler: TraceSampler;
	/** The ratio of the traceidratio samplers (1 when not given). */
	samplerRatio: number;
}

/** What an attempt's span records; the URL's host is taken from `url`, never its path or query. */
export interface AttemptTrace {
	deliveryId: string;
	webhookId: string;
	url: string;
	/** 1 for the first attempt. */
	attempt: number;
	/** The stored traceparent of the delivery's event, or null (stored while tracing was off). */
	traceContext: string | null;
}

/** The emails' span: the outbox row being sent, and the attempt (already counted by the claim). */
export interface EmailTrace {
	id: string;
	attempts: number;
	trace_context?: string | null;
}

export interface EmailResult {
	status?: string;
	next_attempt_at?: string;
	smtp_response?: string | null;
}

/** The node's role as a service name: "all" for every service in one process, else the list. */
export function roleName(services: readonly ServiceName[]): string {
	return ALL_SERVICES.every(name => services.includes(name)) ? "all" : services.join(",");
}

/** The exporter's settings from the standard variables, or null when no endpoint is set. */
export function tracingSettings(config: AppConfig): TracingSettings | null {
	const base = config.OTEL_EXPORTER_OTLP_ENDPOINT;
	const url = config.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ?? (base ? `${base.replace(/\/+$/, "")}/v1/traces` : undefined);
	if (!url) return null;
	return {
		url,
		protocol: config.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL ?? config.OTEL_EXPORTER_OTLP_PROTOCOL,
		serviceName: config.OTEL_SERVICE_NAME ?? roleName(config.SERVICES),
		sampler: config.OTEL_TRACES_SAMPLER,
		samplerRatio: config.OTEL_TRACES_SAMPLER_ARG ?? 1,
	};
}

let runtime: TracingRuntime | null = null;

/**
 * Starts the SDK if the configuration names an endpoint and it is not running yet; returns
 * whether tracing is on. Synchronous, so that the broker built next gets the middleware.
 */
export function startTracing(config: AppConfig): boolean {
	if (runtime) return true;
	const settings = tracingSettings(config);
	if (!settings) return false;
	// Loaded here and only here: without an endpoint no OpenTelemetry module is ever read.
	const { createTracingRuntime } = require("./tracing-sdk") as typeof import("./tracing-sdk");
	runtime = createTracingRuntime(settings);
	return true;
}

export function tracingEnabled(): boolean {
	return runtime !== null;
}

/** Exports the spans ended so far (a stopping node: nothing is lost with the process). */
export async function flushTracing(): Promise<void> {
	await runtime?.flush();
}

/** Flushes and unregisters the SDK; a later startTracing may configure it anew (tests). */
export async function stopTracing(): Promise<void> {
	const stopping = runtime;
	runtime = null;
	await stopping?.stop();
}

/** The broker middleware that carries the context through calls, events and the channel. */
export function tracingMiddleware(): Middleware | undefined {
	return runtime?.middleware;
}

/** The traceparent of the span in progress, to be stored with what it created; null when off. */
export function currentTraceContext(): string | null {
	return runtime ? runtime.currentTraceparent() : null;
}

/**
 * The gateway's span of one HTTP request, continuing the caller's `traceparent` if it sent a
 * valid one; `callOptions.meta` hands it to the actions the request calls.
 */
export function traceHttpRequest(req: IncomingMessage, res: ServerResponse, callOptions: { meta?: Record<string, unknown>; requestID?: string }): void {
	runtime?.traceHttpRequest(req, res, callOptions);
}

/** The span of one delivery attempt, from the times the sender measured. */
export function traceAttempt(attempt: AttemptTrace, outcome: DeliveryOutcome): void {
	runtime?.traceAttempt(attempt, outcome);
}

/** Runs one email's processing inside its span. */
export function traceEmail<T>(email: EmailTrace, work: () => Promise<T>): Promise<T> {
	return runtime ? runtime.traceEmail(email, work) : work();
}

/** Records how the email's attempt ended on its span (called where the outbox row is settled). */
export function noteEmailResult(result: EmailResult): void {
	runtime?.noteEmailResult(result);
}

/** Records an SMTP failure's reply code and error code on the email's span. */
export function noteEmailFailure(failure: { responseCode?: number; code?: string }): void {
	runtime?.noteEmailFailure(failure);
}
