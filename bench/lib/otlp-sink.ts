// A stand-in for an OpenTelemetry collector in the tracing scenario of bench/delivery.ts: it
// takes what the service's OTLP/HTTP exporter POSTs to /v1/traces and answers 200 at once,
// counting requests and bytes without decoding them (a collector's work happens elsewhere).
import http from "node:http";
import type { AddressInfo } from "node:net";

export interface OtlpSink {
	url: string;
	requests: number;
	bytes: number;
	close(): Promise<void>;
}

export async function startOtlpSink(): Promise<OtlpSink> {
	const sink = { url: "", requests: 0, bytes: 0, close: async () => undefined } as OtlpSink;
	const server = http.createServer((req, res) => {
		req.on("data", (chunk: Buffer) => (sink.bytes += chunk.length));
		req.on("end", () => {
			sink.requests += 1;
			res.writeHead(200, { "Content-Type": String(req.headers["content-type"] ?? "application/x-protobuf") }).end();
		});
	});
	await new Promise<void>(resolve => server.listen(0, "127.0.0.1", resolve));
	sink.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
	sink.close = () =>
		new Promise<void>(resolve => {
			server.closeAllConnections();
			server.close(() => resolve());
		});
	return sink;
}
