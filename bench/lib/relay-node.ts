// Child process of bench/delivery.ts: the bare relay. A Moleculer node that takes each
// `tasking.order_status` event from the same JetStream channel the dispatcher consumes, and at
// once sends the signed POST for every target (the same body the dispatcher builds), with no
// database, no leases, no retries. What the dispatcher's latency is compared with.
import { ServiceBroker } from "moleculer";
import { Agent } from "undici";
import { parseConfig } from "../../lib/config";
import { ORDER_STATUS_CHANNEL } from "../../lib/intake-channel";
import { intakeMiddlewares } from "../../lib/intake-jetstream";
import { orderStatusMessage } from "../../lib/schemas/deliveries";
import { TASKING_ORDER_STATUS_TOPIC, type TaskingOrderStatusEvent } from "../../lib/schemas/events";
import { serveUntilStopped } from "./child";
import { startEventLoopProbe } from "./event-loop-probe";
import { signedPost, type SignedTarget } from "./signed-post";
import { secretKeyOf } from "../../lib/signing";

async function main(): Promise<void> {
	const transporter = process.env.TRANSPORTER!;
	const namespace = process.env.NAMESPACE!;
	const targets: SignedTarget[] = (JSON.parse(process.env.RELAY_TARGETS!) as Array<{ url: string; secret: string }>).map(t => ({ url: t.url, key: secretKeyOf(t.secret) }));
	const agent = new Agent({ connections: Number(process.env.RELAY_CONNECTIONS_PER_ORIGIN ?? 8), connect: { ca: process.env.RELAY_CA } });
	const broker = new ServiceBroker({
		namespace,
		nodeID: `${namespace}-relay`,
		transporter: { type: "NATS", options: { url: transporter } },
		logger: false,
		middlewares: intakeMiddlewares(parseConfig({ TRANSPORTER: transporter, NAMESPACE: namespace })),
	});
	broker.createService({
		name: "relay",
		channels: {
			[ORDER_STATUS_CHANNEL]: {
				group: "relay",
				maxInFlight: 1_000,
				async handler(event: TaskingOrderStatusEvent) {
					const body = Buffer.from(orderStatusMessage(event, TASKING_ORDER_STATUS_TOPIC, new Date().toISOString()));
					await Promise.all(targets.map(target => signedPost(agent, target, body)));
				},
			},
		},
	} as Parameters<ServiceBroker["createService"]>[0]);
	await broker.start();
	startEventLoopProbe();
	serveUntilStopped({ nodeID: broker.nodeID }, async () => {
		await broker.stop();
		await agent.close();
	});
}

main().catch(err => {
	process.stderr.write(`bench relay failed: ${err instanceof Error ? err.stack : String(err)}\n`);
	process.exit(1);
});
