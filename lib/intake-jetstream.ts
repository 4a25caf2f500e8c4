// Durable intake in cluster mode, the JetStream side of lib/intake-channel.ts: the stream, its
// durable consumers, and the @moleculer/channels middleware on them. moleculer.config.ts loads
// this module only when TRANSPORTER is set.
//
// Why provisioning lives here and runs on every node: the adapter creates the stream and a
// consumer only when a service subscribes, and its consumers start at "new" messages. An event
// sent while no dispatcher had ever run would find no stream (a NATS 503) or be skipped by the
// consumer created later. So every node of ours creates the stream and both durable consumers at
// start-up, idempotently, starting at the first message.
//
// The adapter is @moleculer/channels' own NATS adapter less one publish per message (see
// IntakeNatsAdapter below).
import { Adapters, Middleware as ChannelsMiddleware } from "@moleculer/channels";
import type { Middleware, ServiceBroker } from "moleculer";
import { connect, nanos, type ConsumerConfig, type JetStreamManager, type NatsConnection } from "nats";
import { ConfigError, type AppConfig } from "./config";
import { maskedUrl, natsServerOptions, type NatsFiles } from "./connection-urls";
import { INTAKE_GROUPS, INTAKE_MAX_IN_FLIGHT, INTAKE_STREAM_SETTINGS, intakeDeliverSubject, intakeNames, type IntakeGroup, type IntakeNames } from "./intake-channel";

/**
 * `ackWaitMs` (INTAKE_ACK_WAIT): a handler that has not acknowledged within this long is presumed
 * dead, and JetStream hands the event to another instance of the group.
 */
function consumerConfig(names: IntakeNames, group: IntakeGroup, ackWaitMs: number): Partial<ConsumerConfig> {
	return {
		durable_name: group,
		// The adapter subscribes every instance as a queue named after the stream.
		deliver_group: names.stream,
		deliver_subject: intakeDeliverSubject(names, group),
		filter_subject: names.subject,
		deliver_policy: "all" as ConsumerConfig["deliver_policy"],
		ack_policy: "explicit" as ConsumerConfig["ack_policy"],
		ack_wait: nanos(ackWaitMs),
		max_ack_pending: INTAKE_MAX_IN_FLIGHT,
	};
}

async function ensureStream(manager: JetStreamManager, name: string, subject: string): Promise<void> {
	try {
		await manager.streams.info(name);
	} catch (err) {
		if ((err as { code?: string }).code !== "404") throw err;
		await manager.streams.add({ ...INTAKE_STREAM_SETTINGS, name, subjects: [subject] }).catch(async addErr => {
			// Another node created it between our look and our add. The server answers "already in
			// use", or, when both adds passed its name check at the same moment, "subjects overlap
			// with an existing stream" (a cluster test's dispatcher died of that at start-up). Either
			// way the stream is there now; if it is not, the error was something else.
			const created = await manager.streams.info(name).catch(() => undefined);
			if (!created) throw addErr;
		});
	}
}

async function ensureConsumer(manager: JetStreamManager, stream: string, config: Partial<ConsumerConfig>): Promise<void> {
	try {
		const existing = await manager.consumers.info(stream, config.durable_name!);
		// A changed INTAKE_ACK_WAIT applies to the consumer that exists already, not only to new ones.
		if (existing.config.ack_wait !== config.ack_wait) await manager.consumers.update(stream, config.durable_name!, { ack_wait: config.ack_wait });
	} catch (err) {
		if ((err as { code?: string }).code !== "404") throw err;
		await manager.consumers.add(stream, config).catch(addErr => {
			if (!/already (in use|exists)/.test((addErr as Error).message)) throw addErr;
		});
	}
}

/** A plain NATS connection from a TRANSPORTER value (one or more comma-separated nats:// or tls:// URLs). */
export function connectToNats(natsUrl: string, name: string, natsFiles: NatsFiles = {}): Promise<NatsConnection> {
	return connect({ ...natsServerOptions(natsUrl, natsFiles), name });
}

/** Removes the intake's streams of a namespace (throw-away namespaces of tests and benchmarks). */
export async function dropIntakeStreams(natsUrl: string, namespace: string): Promise<void> {
	const connection = await connectToNats(natsUrl, "intake-cleanup");
	try {
		const manager = await connection.jetstreamManager();
		const names = intakeNames(namespace);
		for (const stream of [names.stream, names.deadLetterStream]) await manager.streams.delete(stream).catch(() => undefined);
	} finally {
		await connection.close();
	}
}

/** Creates the intake stream, its dead-letter stream and every group's durable consumer, on TRANSPORTER's NATS. */
export async function provisionIntake(config: AppConfig): Promise<void> {
	const natsUrl = config.TRANSPORTER!;
	const names = intakeNames(config.NAMESPACE);
	let connection: NatsConnection | undefined;
	try {
		connection = await connectToNats(natsUrl, "intake-provisioning", config);
		const manager = await connection.jetstreamManager().catch(err => {
			// nats.js answers a server without JetStream with a bare "503".
			if ((err as { code?: string }).code === "503") throw new ConfigError(`Invalid configuration: TRANSPORTER: the NATS server at ${maskedUrl(natsUrl)} has no JetStream; start it with -js`);
			throw err;
		});
		await ensureStream(manager, names.stream, names.subject);
		await ensureStream(manager, names.deadLetterStream, names.deadLetterSubject);
		for (const group of INTAKE_GROUPS) await ensureConsumer(manager, names.stream, consumerConfig(names, group, config.INTAKE_ACK_WAIT));
	} finally {
		await connection?.close();
	}
}

/** What the adapter's consumer handler touches of a received message (nats.js JsMsg). */
interface ReceivedMessage {
	working(): void;
}

const noProgressAck = () => undefined;

/**
 * The channels' NATS adapter tells JetStream "work in progress" (a +WPI publish, so one more
 * socket write) for every message the moment it arrives. That restarts the ack-wait timer the
 * server started a few milliseconds before, so it buys nothing here: a handler that outlives the
 * ack wait (INTAKE_ACK_WAIT) gets its event redelivered, recognised by event_id, either way. In the delivery
 * benchmark (SQLite, two A/B runs each) leaving it out took the dispatcher from 160 to 151-154 µs
 * of CPU per delivery and from 10.2k to 10.8k deliveries/s. Everything else is the adapter's own
 * handling: acknowledgement after the handler, redelivery and its counters.
 */
export class IntakeNatsAdapter extends Adapters.NATS {
	override createConsumerHandler(...args: Parameters<InstanceType<typeof Adapters.NATS>["createConsumerHandler"]>) {
		const handle = super.createConsumerHandler(...args);
		return (err: Parameters<typeof handle>[0], message: Parameters<typeof handle>[1]) => {
			if (message) (message as unknown as ReceivedMessage).working = noProgressAck;
			return handle(err, message);
		};
	}
}

/**
 * The middlewares that give a cluster node the channel: @moleculer/channels on JetStream, and
 * the provisioning above, run before any service subscribes.
 */
export function intakeMiddlewares(config: AppConfig): Middleware[] {
	const natsUrl = config.TRANSPORTER!;
	const provisioning = {
		name: "IntakeProvisioning",
		async starting(broker: ServiceBroker) {
			await provisionIntake(config);
			broker.logger.info(`Durable intake ready: JetStream stream ${intakeNames(config.NAMESPACE).stream}, groups ${INTAKE_GROUPS.join(", ")}`);
		},
	};
	// The adapter's typings demand every option; its defaults fill what is not given here.
	const channels = ChannelsMiddleware({
		adapter: new IntakeNatsAdapter({
			nats: {
				// The servers, credentials and TLS as options: the adapter, given a URL, would keep only its
				// host and port, and a NATS server that wants a password would refuse the intake.
				// Never give up reconnecting: a closed client would silently stop the intake.
				connectionOptions: { ...natsServerOptions(natsUrl, config), maxReconnectAttempts: -1, reconnectTimeWait: 1_000 },
			},
		} as unknown as ConstructorParameters<typeof IntakeNatsAdapter>[0]),
	} as unknown as Parameters<typeof ChannelsMiddleware>[0]) as unknown as Middleware;
	return [provisioning as unknown as Middleware, channels];
}
