// The NATS clients a cluster node depends on: moleculer's transporter and the @moleculer/channels
// adapter of the durable intake. Neither library exposes them, so they are reached here, in one
// place, for the health check (lib/ops-server.ts) and the entry point (server.ts).
import type { ServiceBroker } from "moleculer";

/** The part of a nats.js connection we use; each member is checked before use. */
export interface NatsClient {
	isClosed?(): boolean;
	flush?(): Promise<void>;
	closed?(): Promise<void | Error>;
}

export interface NatsClients {
	/** moleculer's NATS transporter, with its own `connected` flag. */
	transporter?: { connected?: boolean; client?: NatsClient };
	/** The intake channel's adapter; it connects only after the services have started. */
	intake?: { connected?: boolean; connection?: NatsClient | null };
}

export function natsClientsOf(broker: ServiceBroker): NatsClients {
	return {
		transporter: broker.transit?.tx as unknown as NatsClients["transporter"],
		intake: (broker as unknown as { channelAdapter?: NatsClients["intake"] }).channelAdapter,
	};
}

/**
 * Whether the connection answers a PING within `boundMs`. While the client is cut off (it keeps
 * reconnecting) a flush waits for the reconnect, so an outage shows as no answer in time.
 */
export async function answersWithin(client: NatsClient, boundMs: number): Promise<boolean> {
	if (typeof client.flush !== "function" || client.isClosed?.()) return false;
	let timer: NodeJS.Timeout | undefined;
	const timedOut = new Promise<boolean>(resolve => {
		timer = setTimeout(() => resolve(false), boundMs);
	});
	try {
		return await Promise.race([client.flush().then(() => true, () => false), timedOut]);
	} finally {
		clearTimeout(timer);
	}
}
