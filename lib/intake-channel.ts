// Durable intake in cluster mode: `tasking.order_status` is a JetStream stream reached through
// @moleculer/channels, with one durable consumer group per consuming service (dispatcher,
// notifier). A producer's `broker.sendToChannel` resolves once JetStream has stored the event;
// each group then receives it until one of its members acknowledges it.
//
// Why provisioning lives here and runs on every node: the adapter creates the stream and a
// consumer only when a service subscribes, and its consumers start at "new" messages. An event
// sent while no dispatcher had ever run would find no stream (a NATS 503) or be skipped by the
// consumer created later. So every node of ours creates the stream and both durable consumers at
// start-up, idempotently, starting at the first message.
//
// The adapter is @moleculer/channels' own NATS adapter less one publish per message (see
// IntakeNatsAdapter below).
import crypto from "node:crypto";
import { Adapters, Middleware as ChannelsMiddleware } from "@moleculer/channels";
import type { Middleware, ServiceBroker } from "moleculer";
import { connect, headers, nanos, type MsgHdrs, type ConsumerConfig, type JetStreamManager, type NatsConnection, type StreamConfig } from "nats";
import { ConfigError, type AppConfig } from "./config";

export const ORDER_STATUS_CHANNEL = "tasking.order_status";
export const INTAKE_GROUPS = ["dispatcher", "notifier"] as const;
export type IntakeGroup = (typeof INTAKE_GROUPS)[number];

/** Unacknowledged events per group, across all its instances: what a slow database can queue. */
export const INTAKE_MAX_IN_FLIGHT = 1_000;
/**
 * An event that still cannot be persisted after this many deliveries moves to the dead-letter
 * stream. With the back-off below that is about 100 minutes of a database outage.
 */
export const INTAKE_MAX_DELIVERIES = 200;
const REDELIVERY_BASE_MS = 1_000;
const REDELIVERY_MAX_MS = 30_000;

/** How long JetStream waits before the n-th redelivery of an event we could not persist. */
export function redeliveryDelayMs(deliveriesSoFar: number): number {
	return Math.min(REDELIVERY_MAX_MS, REDELIVERY_BASE_MS * 2 ** Math.max(0, deliveriesSoFar - 1));
}
// Stored events are kept this long whether or not they were consumed, so that a consumer group
// that was down for days can still catch up, and the disk use stays bounded.
const STREAM_MAX_AGE_MS = 7 * 24 * 3_600_000;
const DEAD_LETTER_SUFFIX = "dead-letter";

/** Channel, stream and subject names, as @moleculer/channels derives them from the namespace. */
export interface IntakeNames {
	subject: string;
	stream: string;
	deadLetterSubject: string;
	deadLetterStream: string;
}

export function intakeNames(namespace: string): IntakeNames {
	const prefixed = (name: string) => (namespace ? `${namespace}.${name}` : name);
	const streamOf = (subject: string) => subject.split(".").join("_");
	const subject = prefixed(ORDER_STATUS_CHANNEL);
	const deadLetterSubject = prefixed(`${ORDER_STATUS_CHANNEL}.${DEAD_LETTER_SUFFIX}`);
	return { subject, stream: streamOf(subject), deadLetterSubject, deadLetterStream: streamOf(deadLetterSubject) };
}

/** Given to the adapter and to our own provisioning, so both create exactly the same stream. */
const STREAM_SETTINGS: Partial<StreamConfig> = { max_age: nanos(STREAM_MAX_AGE_MS) };

/** Where JetStream pushes a group's events; the group's instances subscribe to it as one queue. */
export function intakeDeliverSubject(names: IntakeNames, group: IntakeGroup): string {
	return `_INTAKE.${names.stream}.${group}`;
}

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

/**
 * The `channels` entry a consuming service puts in its schema. The durable consumer itself was
 * provisioned before the service subscribes, so the adapter attaches to it as it is.
 */
export function intakeChannelSettings(group: IntakeGroup) {
	return {
		group,
		maxInFlight: INTAKE_MAX_IN_FLIGHT,
		maxRetries: INTAKE_MAX_DELIVERIES,
		// Our handler dead-letters by itself (deadLetter below): the adapter's own way acknowledges
		// the event even when moving it failed, which would lose it.
		deadLettering: { enabled: false },
		// The same stream settings as provisionIntake, so the adapter's own "add" is a no-op.
		nats: { streamConfig: STREAM_SETTINGS },
	};
}

async function ensureStream(manager: JetStreamManager, name: string, subject: string): Promise<void> {
	try {
		await manager.streams.info(name);
	} catch (err) {
		if ((err as { code?: string }).code !== "404") throw err;
		await manager.streams.add({ ...STREAM_SETTINGS, name, subjects: [subject] }).catch(async addErr => {
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

/** A plain NATS connection from a TRANSPORTER value (one or more comma-separated nats:// URLs). */
export function connectToNats(natsUrl: string, name: string): Promise<NatsConnection> {
	return connect({ servers: natsUrl.split(",").map(server => new URL(server).host), name });
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

/** Creates the intake stream, its dead-letter stream and every group's durable consumer. */
export async function provisionIntake(natsUrl: string, config: AppConfig): Promise<void> {
	const names = intakeNames(config.NAMESPACE);
	let connection: NatsConnection | undefined;
	try {
		connection = await connectToNats(natsUrl, "intake-provisioning");
		const manager = await connection.jetstreamManager().catch(err => {
			// nats.js answers a server without JetStream with a bare "503".
			if ((err as { code?: string }).code === "503") throw new ConfigError(`Invalid configuration: TRANSPORTER: the NATS server at ${natsUrl} has no JetStream; start it with -js`);
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
			await provisionIntake(natsUrl, config);
			broker.logger.info(`Durable intake ready: JetStream stream ${intakeNames(config.NAMESPACE).stream}, groups ${INTAKE_GROUPS.join(", ")}`);
		},
	};
	// The adapter's typings demand every option; its defaults fill what is not given here.
	const channels = ChannelsMiddleware({
		adapter: new IntakeNatsAdapter({
			nats: {
				url: natsUrl,
				// Never give up reconnecting: a closed client would silently stop the intake.
				connectionOptions: { maxReconnectAttempts: -1, reconnectTimeWait: 1_000 },
			},
		} as unknown as ConstructorParameters<typeof IntakeNatsAdapter>[0]),
	} as unknown as Parameters<typeof ChannelsMiddleware>[0]) as unknown as Middleware;
	return [provisioning as unknown as Middleware, channels];
}

/** The header that names the consumer group that gave an event up. */
export const DEAD_LETTER_GROUP_HEADER = "x-original-group";

interface ChannelAdapter {
	client?: { publish(subject: string, data: Uint8Array, options?: { headers?: MsgHdrs }): Promise<unknown> };
}

/**
 * Stores an event that a group gave up on in the dead-letter stream, with the group's name.
 * Resolves once JetStream has stored it; rejects otherwise, and the caller keeps the event.
 */
export async function deadLetter(broker: ServiceBroker, namespace: string, group: IntakeGroup, event: unknown): Promise<void> {
	const client = (broker as unknown as { channelAdapter?: ChannelAdapter }).channelAdapter?.client;
	if (!client) throw new Error("the intake channel is not connected");
	const marks = headers();
	marks.set(DEAD_LETTER_GROUP_HEADER, group);
	await client.publish(intakeNames(namespace).deadLetterSubject, Buffer.from(JSON.stringify(event)), { headers: marks });
}

interface JetStreamMessageInfo {
	stream: string;
	streamSequence: number;
	timestampNanos: number;
	redeliveryCount: number;
}

/**
 * An event without event_id still needs one id that both groups agree on, so that a redelivery
 * is recognised as a repeat: derived from the stored message's place in its stream.
 */
export function stableEventId(info: Pick<JetStreamMessageInfo, "stream" | "streamSequence" | "timestampNanos">): string {
	const hex = crypto.createHash("sha256").update(`${info.stream}:${info.streamSequence}:${info.timestampNanos}`).digest("hex");
	// Shaped as an RFC 9562 version 8 (custom) UUID.
	const variant = ((parseInt(hex[16], 16) & 0x3) | 0x8).toString(16);
	return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-8${hex.slice(13, 16)}-${variant}${hex.slice(17, 20)}-${hex.slice(20, 32)}`;
}
