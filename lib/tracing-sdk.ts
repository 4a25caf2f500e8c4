// The OpenTelemetry side of lib/tracing.ts, required by it only when an OTLP endpoint is set:
// the NodeSDK with one OTLP/HTTP trace exporter (protobuf or JSON), the sampler of
// OTEL_TRACES_SAMPLER, and the spans. Nothing here is imported by anything else.
//
// Spans, and what gives them their parent:
//   HTTP request          SERVER    the request's `traceparent` header, else a new trace
//   <service.action>      SERVER / INTERNAL  ctx.meta.traceparent; only within a trace, except
//                         the entry points (ROOT_ACTIONS), so that background work (webhook
//                         look-ups, polls) does not start a trace per call
//   <event>               CONSUMER  ctx.meta.traceparent; tasking.order_status may start a trace
//   <channel> publish     PRODUCER  the active span, else a new trace; its traceparent goes into
//                         the JetStream message's headers
//   <channel> process     CONSUMER  the message's `traceparent` header, else a new trace
//   webhook attempt       CLIENT    the traceparent stored with the delivery's message
//   email send            CLIENT    the traceparent stored with the outbox row
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Context as MoleculerContext, Middleware } from "moleculer";
import {
	context,
	defaultTextMapGetter,
	isSpanContextValid,
	propagation,
	ROOT_CONTEXT,
	SpanKind,
	SpanStatusCode,
	trace,
	type Context,
	type Span,
	type TextMapGetter,
	type Tracer,
} from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { NodeSDK } from "@opentelemetry/sdk-node";
import { OTLPTraceExporter as ProtobufTraceExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { OTLPTraceExporter as JsonTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { AlwaysOffSampler, AlwaysOnSampler, BatchSpanProcessor, ParentBasedSampler, TraceIdRatioBasedSampler, type Sampler, type SpanProcessor } from "@opentelemetry/sdk-trace-base";
import { version } from "../package.json";
import type { DeliveryOutcome } from "./webhook-sender";
import type { AttemptTrace, EmailResult, EmailTrace, TraceSampler, TracingSettings } from "./tracing";

const SERVICE_NAMESPACE = "satellite-webhooks";
const TRACER_NAME = "satellite-webhooks";
/** Moleculer's own action behind every gateway request: the HTTP span stands for it. */
const GATEWAY_ROOT_ACTION = "api.rest";
/** Actions other services call to hand an event in: they may start its trace. */
const ROOT_ACTIONS = new Set(["dispatcher.publish"]);
/** Events that bring an event in from outside a trace. */
const ROOT_EVENTS = new Set(["tasking.order_status"]);

export interface TracingRuntime {
	middleware: Middleware;
	currentTraceparent(): string | null;
	traceHttpRequest(req: IncomingMessage, res: ServerResponse, callOptions: { meta?: Record<string, unknown>; requestID?: string }): void;
	traceAttempt(attempt: AttemptTrace, outcome: DeliveryOutcome): void;
	traceEmail<T>(email: EmailTrace, work: () => Promise<T>): Promise<T>;
	noteEmailResult(result: EmailResult): void;
	noteEmailFailure(failure: { responseCode?: number; code?: string }): void;
	flush(): Promise<void>;
	stop(): Promise<void>;
}

function samplerOf(name: TraceSampler, ratio: number): Sampler {
	switch (name) {
		case "always_on":
			return new AlwaysOnSampler();
		case "always_off":
			return new AlwaysOffSampler();
		case "traceidratio":
			return new TraceIdRatioBasedSampler(ratio);
		case "parentbased_always_off":
			return new ParentBasedSampler({ root: new AlwaysOffSampler() });
		case "parentbased_traceidratio":
			return new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(ratio) });
		case "parentbased_always_on":
			return new ParentBasedSampler({ root: new AlwaysOnSampler() });
	}
}

/** The span's context as a traceparent header value (version 00). */
function traceparentOf(span: Span): string | null {
	const spanContext = span.spanContext();
	if (!isSpanContextValid(spanContext)) return null;
	return `00-${spanContext.traceId}-${spanContext.spanId}-${(spanContext.traceFlags & 0xff).toString(16).padStart(2, "0")}`;
}

/** NATS message headers (nats.js MsgHdrs) as a carrier; `get` answers "" for a missing header. */
interface MessageHeaders {
	get(key: string): string;
	keys(): string[];
}

const messageHeaderGetter: TextMapGetter<MessageHeaders | undefined> = {
	get: (carrier, key) => carrier?.get(key) || undefined,
	keys: carrier => carrier?.keys() ?? [],
};

type ActionHandler = (ctx: MoleculerContext) => Promise<unknown>;
type ChannelHandler = (payload: unknown, raw: unknown) => Promise<unknown>;
type CallOptions = { meta?: Record<string, unknown> } & Record<string, unknown>;
type RoutedRequest = IncomingMessage & { $alias?: { fullPath?: string } };

/** A client's mistake (4xx) is the caller's outcome, not a failure of the span's work. */
function isClientError(err: unknown): boolean {
	const code = (err as { code?: unknown })?.code;
	return typeof code === "number" && code >= 400 && code < 500;
}

export function createTracingRuntime(settings: TracingSettings): TracingRuntime {
	const propagator = new W3CTraceContextPropagator();
	const exporter = settings.protocol === "http/json" ? new JsonTraceExporter({ url: settings.url }) : new ProtobufTraceExporter({ url: settings.url });
	const spanProcessor: SpanProcessor = new BatchSpanProcessor(exporter);
	const sdk = new NodeSDK({
		serviceName: settings.serviceName,
		resource: resourceFromAttributes({ "service.namespace": SERVICE_NAMESPACE, "service.version": version }),
		spanProcessors: [spanProcessor],
		sampler: samplerOf(settings.sampler, settings.samplerRatio),
		textMapPropagator: propagator,
		// Traces only: metrics stay on /metrics (Prometheus), logs on standard output.
		metricReaders: [],
		logRecordProcessors: [],
		instrumentations: [],
	});
	sdk.start();
	const tracer: Tracer = trace.getTracer(TRACER_NAME, version);

	/** The context a stored or received traceparent names; ROOT_CONTEXT when it names none. */
	const contextOf = (traceparent: unknown): Context =>
		typeof traceparent === "string" ? propagator.extract(ROOT_CONTEXT, { traceparent }, defaultTextMapGetter) : ROOT_CONTEXT;

	/** The parent of a Moleculer handler: the caller's traceparent in meta, else what is active here. */
	const parentOf = (ctx: MoleculerContext): Context => {
		const traceparent = (ctx.meta as Record<string, unknown> | undefined)?.traceparent;
		return typeof traceparent === "string" ? contextOf(traceparent) : context.active();
	};

	const fail = (span: Span, err: unknown) => {
		span.setAttribute("error.type", (err as Error)?.name || "Error");
		if (!isClientError(err)) span.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error)?.message });
	};

	/** Runs `work` with `span` active, and ends the span when it settles. */
	function within<T>(span: Span, parent: Context, work: () => Promise<T> | T): Promise<T> {
		let running: Promise<T>;
		try {
			running = Promise.resolve(context.with(trace.setSpan(parent, span), work));
		} catch (err) {
			running = Promise.reject(err);
		}
		return running.then(
			value => {
				span.end();
				return value;
			},
			err => {
				fail(span, err);
				span.end();
				throw err;
			},
		);
	}

	/** Call options carrying the active span to the callee, through ctx.meta (which crosses NATS). */
	const withTraceMeta = <T>(opts: T): T => {
		const span = trace.getSpan(context.active());
		const traceparent = span && traceparentOf(span);
		if (!traceparent) return opts;
		// broker.emit also takes the groups in place of the options.
		const options: CallOptions = typeof opts === "string" || Array.isArray(opts) ? { groups: opts } : { ...(opts as CallOptions | undefined) };
		options.meta = { ...options.meta, traceparent };
		return options as T;
	};

	// @moleculer/channels prefixes channel names with the namespace; spans name the channel as
	// producers do, so that every namespace's spans group together.
	let namespacePrefix = "";
	const middleware = {
		name: "OpenTelemetry",

		created(broker: { namespace?: string }) {
			namespacePrefix = broker.namespace ? `${broker.namespace}.` : "";
		},

		call(next: (name: string, params: unknown, opts?: unknown) => Promise<unknown>) {
			return (name: string, params: unknown, opts?: unknown) => next(name, params, withTraceMeta(opts));
		},

		emit(next: (name: string, payload: unknown, opts?: unknown) => Promise<unknown>) {
			return (name: string, payload: unknown, opts?: unknown) => (name.startsWith("$") ? next(name, payload, opts) : next(name, payload, withTraceMeta(opts)));
		},

		broadcast(next: (name: string, payload: unknown, opts?: unknown) => Promise<unknown>) {
			return (name: string, payload: unknown, opts?: unknown) => (name.startsWith("$") ? next(name, payload, opts) : next(name, payload, withTraceMeta(opts)));
		},

		localAction(next: ActionHandler, action: { name: string }): ActionHandler {
			const name = action.name;
			if (name === GATEWAY_ROOT_ACTION) return ctx => context.with(parentOf(ctx), () => next(ctx));
			const mayStartTrace = ROOT_ACTIONS.has(name);
			return ctx => {
				const parent = parentOf(ctx);
				if (!mayStartTrace && !trace.getSpan(parent)) return next(ctx);
				const remote = ctx.nodeID !== undefined && ctx.nodeID !== ctx.broker.nodeID;
				const span = tracer.startSpan(
					name,
					{ kind: remote ? SpanKind.SERVER : SpanKind.INTERNAL, attributes: { "rpc.system": "moleculer", "rpc.method": name, "moleculer.node": ctx.broker.nodeID } },
					parent,
				);
				return within(span, parent, () => next(ctx));
			};
		},

		localEvent(next: ActionHandler, event: { name: string }): ActionHandler {
			const name = event.name;
			if (name.startsWith("$")) return next;
			const mayStartTrace = ROOT_EVENTS.has(name);
			return ctx => {
				const parent = parentOf(ctx);
				if (!mayStartTrace && !trace.getSpan(parent)) return next(ctx);
				const span = tracer.startSpan(name, { kind: SpanKind.CONSUMER, attributes: { "moleculer.event": name, "moleculer.node": ctx.broker.nodeID } }, parent);
				return within(span, parent, () => next(ctx));
			};
		},

		// @moleculer/channels' hooks: the message carries the producer's span in its headers.
		sendToChannel(next: (channel: string, payload: unknown, opts?: { headers?: Record<string, string> }) => Promise<void>) {
			return (channel: string, payload: unknown, opts?: { headers?: Record<string, string> }) => {
				const parent = context.active();
				const span = tracer.startSpan(
					`${channel} publish`,
					{ kind: SpanKind.PRODUCER, attributes: { "messaging.system": "nats", "messaging.operation.type": "send", "messaging.destination.name": channel } },
					parent,
				);
				const traceparent = traceparentOf(span);
				const sent = traceparent ? { ...opts, headers: { ...opts?.headers, traceparent } } : opts;
				return within(span, parent, () => next(channel, payload, sent));
			};
		},

		localChannel(next: ChannelHandler, channel: { name: string; group?: string }): ChannelHandler {
			const name = channel.name.startsWith(namespacePrefix) ? channel.name.slice(namespacePrefix.length) : channel.name;
			return (payload, raw) => {
				const message = raw as { headers?: MessageHeaders; info?: { redeliveryCount?: number; streamSequence?: number }; nak?: (delayMs?: number) => void } | undefined;
				const parent = propagator.extract(ROOT_CONTEXT, message?.headers, messageHeaderGetter);
				const span = tracer.startSpan(
					`${name} process`,
					{
						kind: SpanKind.CONSUMER,
						attributes: {
							"messaging.system": "nats",
							"messaging.operation.type": "process",
							"messaging.destination.name": name,
							...(channel.group ? { "messaging.consumer.group.name": channel.group } : {}),
							...(message?.info?.streamSequence !== undefined ? { "messaging.message.id": String(message.info.streamSequence) } : {}),
							...(message?.info?.redeliveryCount !== undefined ? { "messaging.nats.delivery_count": message.info.redeliveryCount } : {}),
						},
					},
					parent,
				);
				// The intake answers a failure to persist with a delayed redelivery, not an error.
				const nak = message?.nak;
				if (message && nak) {
					message.nak = (delayMs?: number) => {
						span.setStatus({ code: SpanStatusCode.ERROR, message: "not acknowledged: JetStream redelivers it" });
						if (delayMs !== undefined) span.setAttribute("messaging.nats.redelivery_delay_ms", delayMs);
						nak.call(message, delayMs);
					};
				}
				return within(span, parent, () => next(payload, raw));
			};
		},
	} as unknown as Middleware;

	return {
		middleware,

		currentTraceparent() {
			const span = trace.getSpan(context.active());
			return span ? traceparentOf(span) : null;
		},

		traceHttpRequest(req, res, callOptions) {
			const method = req.method ?? "GET";
			const parent = propagator.extract(ROOT_CONTEXT, req.headers, defaultTextMapGetter);
			const span = tracer.startSpan(
				method,
				{
					kind: SpanKind.SERVER,
					attributes: {
						"http.request.method": method,
						// The path may hold ids and the query a signed token (email links): neither is recorded.
						...(callOptions.requestID ? { "request.id": callOptions.requestID } : {}),
					},
				},
				parent,
			);
			const traceparent = traceparentOf(span);
			if (traceparent) callOptions.meta = { ...callOptions.meta, traceparent };
			res.once("close", () => {
				const route = (req as RoutedRequest).$alias?.fullPath;
				if (route) {
					span.updateName(`${method} ${route}`);
					span.setAttribute("http.route", route);
				}
				if (res.writableFinished) {
					span.setAttribute("http.response.status_code", res.statusCode);
					if (res.statusCode >= 500) span.setStatus({ code: SpanStatusCode.ERROR });
				} else {
					span.setAttribute("error.type", "aborted");
				}
				span.end();
			});
		},

		traceAttempt(attempt, outcome) {
			const start = Date.parse(outcome.attemptedAt);
			let host: string | undefined;
			let port: number | undefined;
			try {
				const url = new URL(attempt.url);
				host = url.hostname;
				port = Number(url.port || (url.protocol === "https:" ? 443 : 80));
			} catch {
				// A URL that does not parse never got an answer; its attempt is still recorded.
			}
			const errorType = outcome.success ? undefined : outcome.errorKind === "http_status" && outcome.statusCode !== null ? String(outcome.statusCode) : (outcome.errorKind ?? "unknown");
			const span = tracer.startSpan(
				"webhook attempt",
				{
					kind: SpanKind.CLIENT,
					startTime: start,
					attributes: {
						"webhook.id": attempt.webhookId,
						"webhook.delivery.id": attempt.deliveryId,
						"webhook.attempt": attempt.attempt,
						"webhook.duration_ms": outcome.durationMs,
						"http.request.method": "POST",
						...(host !== undefined ? { "server.address": host, "server.port": port } : {}),
						...(outcome.statusCode !== null ? { "http.response.status_code": outcome.statusCode } : {}),
						...(outcome.errorKind ? { "webhook.error_kind": outcome.errorKind } : {}),
						...(errorType ? { "error.type": errorType } : {}),
					},
				},
				contextOf(attempt.traceContext),
			);
			if (!outcome.success) span.setStatus({ code: SpanStatusCode.ERROR, message: outcome.title ?? undefined });
			span.end(start + outcome.durationMs);
		},

		traceEmail(email, work) {
			const parent = contextOf(email.trace_context);
			const span = tracer.startSpan("email send", { kind: SpanKind.CLIENT, attributes: { "email.outbox_id": email.id, "email.attempt": Number(email.attempts) } }, parent);
			return within(span, parent, work);
		},

		noteEmailResult(result) {
			const span = trace.getActiveSpan();
			if (!span) return;
			const outcome = result.status ?? (result.next_attempt_at ? "retry" : "pending");
			span.setAttribute("email.result", outcome);
			if (result.smtp_response) span.setAttribute("smtp.response", result.smtp_response);
			if (outcome === "failed" || outcome === "retry") span.setStatus({ code: SpanStatusCode.ERROR });
		},

		noteEmailFailure(failure) {
			const span = trace.getActiveSpan();
			if (!span) return;
			if (failure.responseCode !== undefined) span.setAttribute("smtp.response_code", failure.responseCode);
			span.setAttribute("error.type", failure.code ?? (failure.responseCode !== undefined ? String(failure.responseCode) : "smtp"));
		},

		async flush() {
			await spanProcessor.forceFlush();
		},

		async stop() {
			await sdk.shutdown();
			// So that a later start in this process may register its own (tests).
			trace.disable();
			context.disable();
			propagation.disable();
		},
	};
}
