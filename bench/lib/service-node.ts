// Child process of bench/delivery.ts: one node of the service (as `npm start` or one role of
// `npm run cluster` runs it), configured by the environment the parent gives it, joined to the
// parent over NATS. Reports {nodeID} once started; answers "probe" with its event-loop figures.
import type { ServiceBroker } from "moleculer";
import { createApp } from "../../app";
import { parseConfig, resolveSecrets } from "../../lib/config";
import { metricsOf } from "../../lib/metrics";
import { serveUntilStopped } from "./child";
import { startEventLoopProbe, type SenderLoopReader } from "./event-loop-probe";

async function main(): Promise<void> {
	const config = parseConfig(process.env);
	resolveSecrets(config);
	const app = createApp(config, { broker: { logger: { type: "Console", options: { level: "warn" } } } });
	await app.start();
	startEventLoopProbe(senderLoopOf(app.broker));
	serveUntilStopped({ nodeID: app.broker.nodeID }, () => app.stop());
}

/** The dispatcher's sender-thread gauges and claim totals (none on a node without a dispatcher). */
function senderLoopOf(broker: ServiceBroker): SenderLoopReader {
	const samplesOf = async (name: string) => (await metricsOf(broker).getSingleMetric(name)?.get())?.values ?? [];
	const valuesOf = async (name: string) => (await samplesOf(name)).map(sample => sample.value);
	return async () => {
		const delays = await valuesOf("webhook_sender_event_loop_delay_p99_seconds");
		const busy = await valuesOf("webhook_sender_event_loop_utilization");
		const claimSamples = await samplesOf("webhook_delivery_claim_seconds");
		const claimsOf = (suffix: string, kind: string) =>
			claimSamples.find(sample => (sample as { metricName?: string }).metricName === `webhook_delivery_claim_seconds_${suffix}` && sample.labels.kind === kind)?.value ?? 0;
		const claims = { claims_due: claimsOf("count", "due"), claims_due_seconds: claimsOf("sum", "due"), claims_of_webhook: claimsOf("count", "webhook") };
		if (delays.length === 0) return claims;
		return { sender_delay_p99_ms: Math.round(Math.max(...delays) * 1e5) / 100, sender_utilization: Math.round(Math.max(...busy) * 100) / 100, ...claims };
	};
}

main().catch(err => {
	process.stderr.write(`bench service node failed: ${err instanceof Error ? err.stack : String(err)}\n`);
	process.exit(1);
});
