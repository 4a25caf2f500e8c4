// What the benchmarks that run the service as separate processes over NATS share: the outside
// producer (a Moleculer node sending `tasking.order_status` to the durable JetStream channel, as
// README's producer example does) and the probe that reads a child node's CPU and event loop.
import crypto from "node:crypto";
import { ServiceBroker } from "moleculer";
import { parseConfig } from "../../lib/config";
import { natsServerOptions } from "../../lib/connection-urls";
import { ORDER_STATUS_CHANNEL } from "../../lib/intake-channel";
import { intakeMiddlewares } from "../../lib/intake-jetstream";
import type { ChildServer } from "./child";
import type { NatsEnv } from "../../test/helpers/nats-server";
import { PROBE_MESSAGES, type ProbeFigures, type ProbeWindow } from "./event-loop-probe";

export type Probe = Omit<ProbeFigures, "type">;

/** The environment every service node of one deployment shares (bench/lib/service-node.ts reads it). */
export function serviceNodeEnv(namespace: string, nats: NatsEnv, dataDir: string): Record<string, string> {
	return {
		NODE_ENV: "bench",
		LOG_LEVEL: "warn",
		...nats,
		NAMESPACE: namespace,
		DATA_DIR: dataDir,
		PORT: "0",
		SECRETS_KEY: crypto.randomBytes(32).toString("base64"),
	};
}

/**
 * A child's figures since its previous probe (bench/lib/event-loop-probe.ts), which this one
 * resets; the window it opens watches the child's event loop, or (`cpu`) measures its CPU alone.
 */
export function probe(node: ChildServer<unknown>, next: ProbeWindow = "loop"): Promise<Probe> {
	return new Promise(resolve => {
		const onMessage = (message: { type?: string }) => {
			if (message?.type !== "probe") return;
			node.process.off("message", onMessage);
			const { type: _type, ...figures } = message as ProbeFigures;
			resolve(figures);
		};
		node.process.on("message", onMessage);
		node.process.send(PROBE_MESSAGES[next]);
	});
}

export async function probeAll(nodes: Array<ChildServer<unknown>>, next: ProbeWindow = "loop"): Promise<Probe[]> {
	return Promise.all(nodes.map(node => probe(node, next)));
}

export function producerBroker(namespace: string, nats: NatsEnv): ServiceBroker {
	return new ServiceBroker({
		namespace,
		nodeID: `${namespace}-producer`,
		transporter: { type: "NATS", options: natsServerOptions(nats.TRANSPORTER, nats) },
		logger: false,
		middlewares: intakeMiddlewares(parseConfig({ ...nats, NAMESPACE: namespace })),
		// The run stops its producers itself; Moleculer's own Ctrl-C handler would stop this one
		// and exit 0 at once, racing the run's clean-up of its schemas and streams.
		skipProcessEventRegistration: true,
	});
}

/** Sends an event to the durable channel; resolves once JetStream stored it. */
export const sendVia = (producer: ServiceBroker) => (event: object) =>
	(producer as unknown as { sendToChannel(channel: string, payload: unknown): Promise<void> }).sendToChannel(ORDER_STATUS_CHANNEL, event);
