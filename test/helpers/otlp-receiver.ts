// An OTLP/HTTP trace receiver for tests: a plain HTTP server on 127.0.0.1 that takes what the
// service's exporter POSTs to /v1/traces, in JSON or in protobuf, and keeps every span. Protobuf
// is decoded with the OTLP definitions that @opentelemetry/otlp-transformer ships (its generated
// protobufjs root), JSON as the OTLP/JSON encoding defines it (ids in hex).
import http from "node:http";
import type { AddressInfo } from "node:net";
import zlib from "node:zlib";
// The generated root the OTLP packages ship; not a public entry point, so imported by its path.
import generatedRoot from "@opentelemetry/otlp-transformer/build/src/generated/root";

export interface ReceivedSpan {
	traceId: string;
	spanId: string;
	/** "" for a root span. */
	parentSpanId: string;
	name: string;
	/** OTLP's SpanKind number: 1 internal, 2 server, 3 client, 4 producer, 5 consumer. */
	kind: number;
	attributes: Record<string, string | number | boolean>;
	serviceName: string;
	startMs: number;
	endMs: number;
	/** OTLP's status code: 0 unset, 1 ok, 2 error. */
	statusCode: number;
	/** How the request that carried it was encoded. */
	encoding: "json" | "protobuf";
}

export interface OtlpReceiver {
	/** The base endpoint, as OTEL_EXPORTER_OTLP_ENDPOINT takes it. */
	url: string;
	spans: ReceivedSpan[];
	/** Requests that were not an OTLP trace export (wrong path, undecodable body). */
	rejected: string[];
	close(): Promise<void>;
}

type Json = Record<string, any>;

interface ProtobufRoot {
	opentelemetry: { proto: { collector: { trace: { v1: { ExportTraceServiceRequest: { decode(bytes: Uint8Array): unknown; toObject(message: unknown, options: object): Json } } } } } };
}

const ExportTraceServiceRequest = (generatedRoot as unknown as ProtobufRoot).opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest;

function valueOf(any: Json | undefined): string | number | boolean {
	if (!any) return "";
	if (any.stringValue !== undefined) return any.stringValue;
	if (any.intValue !== undefined) return Number(any.intValue);
	if (any.doubleValue !== undefined) return Number(any.doubleValue);
	if (any.boolValue !== undefined) return Boolean(any.boolValue);
	return JSON.stringify(any);
}

function attributesOf(list: Json[] | undefined): Record<string, string | number | boolean> {
	return Object.fromEntries((list ?? []).map(entry => [entry.key, valueOf(entry.value)]));
}

/** Spans of an ExportTraceServiceRequest, with ids already as lower-case hex. */
function spansOf(request: Json, encoding: ReceivedSpan["encoding"]): ReceivedSpan[] {
	const spans: ReceivedSpan[] = [];
	for (const resourceSpans of request.resourceSpans ?? []) {
		const serviceName = String(attributesOf(resourceSpans.resource?.attributes)["service.name"] ?? "");
		for (const scopeSpans of resourceSpans.scopeSpans ?? []) {
			for (const span of scopeSpans.spans ?? []) {
				spans.push({
					traceId: span.traceId,
					spanId: span.spanId,
					parentSpanId: span.parentSpanId ?? "",
					name: span.name,
					kind: Number(span.kind ?? 0),
					attributes: attributesOf(span.attributes),
					serviceName,
					startMs: Number(BigInt(span.startTimeUnixNano) / 1_000_000n),
					endMs: Number(BigInt(span.endTimeUnixNano) / 1_000_000n),
					statusCode: Number(span.status?.code ?? 0),
					encoding,
				});
			}
		}
	}
	return spans;
}

function decode(body: Buffer, contentType: string): ReceivedSpan[] {
	if (contentType.startsWith("application/json")) return spansOf(JSON.parse(body.toString("utf8")) as Json, "json");
	if (contentType.startsWith("application/x-protobuf")) {
		const message = ExportTraceServiceRequest.decode(body);
		// Ids as hex and 64-bit numbers as strings, like the JSON encoding.
		const request = ExportTraceServiceRequest.toObject(message, { longs: String, enums: Number, bytes: String, defaults: false });
		const hex = (base64: string | undefined) => (base64 ? Buffer.from(base64, "base64").toString("hex") : "");
		for (const resourceSpans of request.resourceSpans ?? []) {
			for (const scopeSpans of resourceSpans.scopeSpans ?? []) {
				for (const span of scopeSpans.spans ?? []) {
					span.traceId = hex(span.traceId);
					span.spanId = hex(span.spanId);
					span.parentSpanId = hex(span.parentSpanId);
				}
			}
		}
		return spansOf(request, "protobuf");
	}
	throw new Error(`unexpected content type ${contentType}`);
}

export async function startOtlpReceiver(): Promise<OtlpReceiver> {
	const spans: ReceivedSpan[] = [];
	const rejected: string[] = [];
	const server = http.createServer((req, res) => {
		const chunks: Buffer[] = [];
		req.on("data", chunk => chunks.push(chunk));
		req.on("end", () => {
			try {
				if (req.method !== "POST" || req.url !== "/v1/traces") throw new Error(`${req.method} ${req.url}`);
				let body = Buffer.concat(chunks);
				if (req.headers["content-encoding"] === "gzip") body = zlib.gunzipSync(body);
				const contentType = String(req.headers["content-type"] ?? "");
				spans.push(...decode(body, contentType));
				// An empty ExportTraceServiceResponse: full success.
				res.writeHead(200, { "Content-Type": contentType.startsWith("application/json") ? "application/json" : "application/x-protobuf" });
				res.end(contentType.startsWith("application/json") ? "{}" : Buffer.alloc(0));
			} catch (err) {
				rejected.push((err as Error).message);
				res.writeHead(400).end();
			}
		});
	});
	await new Promise<void>(resolve => server.listen(0, "127.0.0.1", resolve));
	const { port } = server.address() as AddressInfo;
	return {
		url: `http://127.0.0.1:${port}`,
		spans,
		rejected,
		close: () =>
			new Promise<void>(resolve => {
				server.closeAllConnections();
				server.close(() => resolve());
			}),
	};
}
