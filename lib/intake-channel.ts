// The intake channel's names and settings, shared by every node: `tasking.order_status` is, in
// cluster mode, a JetStream stream reached through @moleculer/channels, with one durable consumer
// group per consuming service (dispatcher, notifier). A producer's `broker.sendToChannel` resolves
// once JetStream has stored the event; each group then receives it until one of its members
// acknowledges it. The JetStream side itself (provisioning, the adapter, the middlewares) is
// lib/intake-jetstream.ts, which only a cluster node loads: nats.js and @moleculer/channels cost an
// embedded node about 85 ms of CPU at every start for a channel it never opens.
import crypto from "node:crypto";
import type { ServiceBroker } from "moleculer";
import type { MsgHdrs, StreamConfig } from "nats";

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
export const INTAKE_STREAM_SETTINGS: Partial<StreamConfig> = { max_age: STREAM_MAX_AGE_MS * 1_000_000 /* nanoseconds */ };

/** Where JetStream pushes a group's events; the group's instances subscribe to it as one queue. */
export function intakeDeliverSubject(names: IntakeNames, group: IntakeGroup): string {
	return `_INTAKE.${names.stream}.${group}`;
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
		nats: { streamConfig: INTAKE_STREAM_SETTINGS },
	};
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
	// nats.js loads here, in a cluster node, the only kind with a channel to dead-letter from.
	const { headers } = require("nats") as typeof import("nats");
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
