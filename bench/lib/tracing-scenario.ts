// The tracing scenario of the delivery benchmark (BENCH_SCENARIOS=tracing): what OpenTelemetry
// traces cost a SQLite node's throughput.
import { deploy, EVENTS, throughput, WARM_UP_EVENTS } from "./deployment";
import { startOtlpSink } from "./otlp-sink";
import type { Receivers } from "./receivers";
import { mean, ratioOf, round } from "./stats";

// Throughput with tracing on and off, measured this many times each, taking turns.
const TRACING_ROUNDS = Number(process.env.BENCH_TRACING_ROUNDS ?? 2);

/**
 * Throughput with traces on (sampler always_on, exporting over OTLP/HTTP protobuf to a local
 * sink) against traces off, on fresh SQLite nodes, the rounds taking turns so that the machine's
 * drift lands on both. The producer sends no traceparent: each event's trace starts at the
 * dispatcher's consumption of the channel message, and its attempts are spans of it.
 */
export async function tracingScenario(healthyUrls: string[], caFile: string, receivers: Receivers) {
	const sink = await startOtlpSink();
	const tracingOn = { OTEL_EXPORTER_OTLP_ENDPOINT: sink.url, OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf", OTEL_TRACES_SAMPLER: "always_on" };
	const rates: { off: number[]; on: number[] } = { off: [], on: [] };
	try {
		for (let turn = 0; turn < TRACING_ROUNDS; turn++) {
			for (const mode of ["off", "on"] as const) {
				const deployment = await deploy({ engine: "sqlite", healthyUrls, caFile, env: mode === "on" ? tracingOn : {} });
				try {
					await throughput(deployment, receivers, WARM_UP_EVENTS);
					rates[mode].push(await throughput(deployment, receivers, EVENTS));
				} finally {
					await deployment.stop();
				}
			}
		}
	} finally {
		await sink.close();
	}
	return {
		rounds: TRACING_ROUNDS,
		deliveries_per_s_off: rates.off.map(round),
		deliveries_per_s_on: rates.on.map(round),
		throughput_on_vs_off: ratioOf(mean(rates.on), mean(rates.off)),
		goal_on_vs_off: 0.9,
		exported: { requests: sink.requests, kib: round(sink.bytes / 1024) },
	};
}
