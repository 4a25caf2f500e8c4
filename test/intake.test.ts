// Event intake in both modes, seen from the producers' side: every documented path reaches both
// consumers (webhook deliveries and email), an event without event_id gets one id that both
// agree on, and a bad event is recorded as rejected once, not redelivered forever.
// The fault tests (test/cluster*.test.ts) kill and cut things; this suite checks the contract.
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import { ServiceBroker } from "moleculer";
import { startDeliveryStack, waitUntil, type DeliveryStack } from "./helpers/delivery-stack";
import { describeWhere, TEST_NATS_URL } from "./helpers/services";
import { nanos } from "nats";
import { deadLetter, intakeNames, INTAKE_GROUPS, stableEventId } from "../lib/intake-channel";
import { connectToNats, dropIntakeStreams, intakeMiddlewares, provisionIntake } from "../lib/intake-jetstream";
import { spawn } from "node:child_process";
import path from "node:path";
import { parseConfig } from "../lib/config";
import type { OutboxEntry } from "../services/notifier.service";
import { implicitCustomerId } from "../lib/customers";

const TOPIC = "tasking:order_status";

/** Polls until `probe` answers something. */
function eventually<T>(what: string, probe: () => Promise<T | undefined>): Promise<T> {
	return waitUntil(probe, value => value !== undefined, what) as Promise<T>;
}

async function optIn(env: DeliveryStack, sub: string): Promise<string> {
	const token = await env.stack.token(sub, { email: `${sub}@example.com`, name: sub });
	const response = await env.stack.request("PUT", "/id/v3/user/settings", { token, body: { notifications: [{ category: "tasking", settings: [{ topic: TOPIC, email: true }] }] } });
	expect(response.status).toBe(200);
	return token;
}

const fulfilledOrder = (userId: string, customerId: string) => ({
	customer_id: customerId,
	user_id: userId,
	order_id: `ord-${crypto.randomBytes(4).toString("hex")}`,
	status: "fulfilled",
});

async function outboxFor(env: DeliveryStack, userId: string): Promise<OutboxEntry[]> {
	const entries: OutboxEntry[] = await env.stack.app.broker.call("notifier.outbox", { limit: 500 });
	return entries.filter(entry => entry.user_id === userId);
}

function runScript(command: string[], env: Record<string, string>): Promise<{ code: number | null; output: string }> {
	return new Promise(resolve => {
		const child = spawn(command[0], command.slice(1), { cwd: path.resolve(__dirname, ".."), env: { ...process.env, ...env } });
		let output = "";
		child.stdout.on("data", chunk => (output += chunk));
		child.stderr.on("data", chunk => (output += chunk));
		child.on("close", code => resolve({ code, output }));
	});
}

async function deliveredEventIds(env: DeliveryStack, webhookId: string): Promise<string[]> {
	return (await env.stack.db("deliveries").where({ webhook_id: webhookId }).select("event_id")).map((row: { event_id: string }) => row.event_id);
}

describe("intake, embedded mode", () => {
	let env: DeliveryStack;
	beforeAll(async () => {
		env = await startDeliveryStack("sqlite", { env: { MAIL_POLL_INTERVAL: "100ms" } });
	});
	afterAll(() => env?.stop());

	it("dispatcher.publish reaches the notifier too, under the event_id it answers with", async () => {
		const token = await optIn(env, "pub-alice");
		const webhook = await env.createWebhook(token);
		const customerId = implicitCustomerId("pub-alice");
		const answer: { event_id: string; deliveries: number } = await env.stack.app.broker.call("dispatcher.publish", fulfilledOrder("pub-alice", customerId));
		expect(answer.deliveries).toBe(1);
		const [email] = await eventually("the email", async () => {
			const rows = await outboxFor(env, "pub-alice");
			return rows.length ? rows : undefined;
		});
		expect(email.event_id).toBe(answer.event_id);
		await eventually("the delivery", async () => (env.received(webhook).length ? true : undefined));
		expect(await deliveredEventIds(env, webhook.id)).toEqual([answer.event_id]);
	});
});

const describeWithNats = describeWhere({ nats: true, postgres: true });

describeWithNats("intake, cluster mode on JetStream", () => {
	const namespace = `intake-${crypto.randomBytes(4).toString("hex")}`;
	let env: DeliveryStack;
	let producer: ServiceBroker;

	beforeAll(async () => {
		env = await startDeliveryStack("postgres", { env: { TRANSPORTER: TEST_NATS_URL, NAMESPACE: namespace, NODE_ID: `${namespace}-all`, MAIL_POLL_INTERVAL: "100ms" } });
		producer = new ServiceBroker({ namespace, nodeID: `${namespace}-producer`, transporter: TEST_NATS_URL, logger: false, middlewares: intakeMiddlewares(parseConfig({ TRANSPORTER: TEST_NATS_URL, NAMESPACE: namespace })) });
		await producer.start();
	});

	afterAll(async () => {
		await producer?.stop();
		await env?.stop();
		// Leave the shared JetStream server as it was.
		await dropIntakeStreams(TEST_NATS_URL, namespace);
	});

	it("provisions the stream and a durable consumer per group, starting at the first event, with INTAKE_ACK_WAIT", async () => {
		const nats = await connectToNats(TEST_NATS_URL, "intake-test");
		try {
			const manager = await nats.jetstreamManager();
			const names = intakeNames(namespace);
			expect((await manager.streams.info(names.stream)).config.subjects).toEqual([`${namespace}.tasking.order_status`]);
			for (const group of INTAKE_GROUPS) {
				const consumer = await manager.consumers.info(names.stream, group);
				expect(consumer.config).toMatchObject({ durable_name: group, deliver_policy: "all", ack_policy: "explicit", filter_subject: names.subject, ack_wait: nanos(60_000) });
			}
			// A node started with another INTAKE_ACK_WAIT applies it to the consumers that exist.
			await provisionIntake(parseConfig({ TRANSPORTER: TEST_NATS_URL, NAMESPACE: namespace, INTAKE_ACK_WAIT: "5s" }));
			for (const group of INTAKE_GROUPS) expect((await manager.consumers.info(names.stream, group)).config.ack_wait).toBe(nanos(5_000));
			await provisionIntake(parseConfig({ TRANSPORTER: TEST_NATS_URL, NAMESPACE: namespace }));
			for (const group of INTAKE_GROUPS) expect((await manager.consumers.info(names.stream, group)).config.ack_wait).toBe(nanos(60_000));
		} finally {
			await nats.close();
		}
	});

	it("lets nodes that start together provision a fresh namespace, every one of them", async () => {
		const fresh = `${namespace}-together`;
		try {
			const outcomes = await Promise.allSettled(Array.from({ length: 8 }, () => provisionIntake(parseConfig({ TRANSPORTER: TEST_NATS_URL, NAMESPACE: fresh }))));
			expect(outcomes.map(outcome => (outcome.status === "rejected" ? String(outcome.reason) : "ok"))).toEqual(Array(8).fill("ok"));
			const nats = await connectToNats(TEST_NATS_URL, "intake-test");
			try {
				expect((await (await nats.jetstreamManager()).streams.info(intakeNames(fresh).stream)).config.subjects).toEqual([`${fresh}.tasking.order_status`]);
			} finally {
				await nats.close();
			}
		} finally {
			await dropIntakeStreams(TEST_NATS_URL, fresh);
		}
	});

	it("delivers an event sent to the channel as a webhook and an email, under one derived event_id", async () => {
		const token = await optIn(env, "chan-bob");
		const webhook = await env.createWebhook(token);
		const customerId = implicitCustomerId("chan-bob");
		// No event_id: both groups derive the same one from the stored message.
		await (producer as unknown as { sendToChannel(channel: string, payload: unknown): Promise<void> }).sendToChannel("tasking.order_status", fulfilledOrder("chan-bob", customerId));
		await eventually("the delivery", async () => (env.received(webhook).length ? true : undefined));
		const [email] = await eventually("the email", async () => {
			const rows = await outboxFor(env, "chan-bob");
			return rows.length ? rows : undefined;
		});
		expect(email.event_id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
		expect(await deliveredEventIds(env, webhook.id)).toEqual([email.event_id]);
	});

	it("acknowledges each event once per group after persisting it, with no work-in-progress message before", async () => {
		const token = await optIn(env, "chan-dan");
		const webhook = await env.createWebhook(token);
		const customerId = implicitCustomerId("chan-dan");
		// Every acknowledgement a consumer sends is a core NATS publish on the stream's $JS.ACK subjects.
		const nats = await connectToNats(TEST_NATS_URL, "intake-ack-watch");
		const answers: string[] = [];
		const watch = nats.subscribe(`$JS.ACK.${intakeNames(namespace).stream}.>`, { callback: (_err, message) => answers.push(new TextDecoder().decode(message.data)) });
		// The tables the two groups persist into, locked against writes (reads still work), so
		// that both consumers hold their events unpersisted for as long as the test says.
		const persistLock = await env.stack.db.transaction();
		try {
			await nats.flush();
			await persistLock.raw("LOCK TABLE delivery_messages, deliveries, email_outbox IN EXCLUSIVE MODE");
			const events = Array.from({ length: 5 }, () => fulfilledOrder("chan-dan", customerId));
			for (const event of events) await (producer as unknown as { sendToChannel(channel: string, payload: unknown): Promise<void> }).sendToChannel("tasking.order_status", event);
			// Both groups are now stuck writing: no acknowledgement may have gone out yet.
			await eventually("both groups to wait on the locked tables", async () => {
				const waiting: Array<{ relation: string }> = (
					await env.stack.db.raw(
						"SELECT l.relation::regclass::text AS relation FROM pg_locks l WHERE NOT l.granted AND l.relation IN ('delivery_messages'::regclass, 'deliveries'::regclass, 'email_outbox'::regclass)",
					)
				).rows;
				const relations = new Set(waiting.map(row => row.relation.replace(/^.*\./, "")));
				return relations.has("email_outbox") && (relations.has("delivery_messages") || relations.has("deliveries")) ? true : undefined;
			});
			await nats.flush();
			expect(answers).toEqual([]);
			await persistLock.commit();
			await eventually("the deliveries", async () => (env.received(webhook).length === events.length ? true : undefined));
			await eventually("the emails", async () => ((await outboxFor(env, "chan-dan")).length === events.length ? true : undefined));
			await eventually("an acknowledgement per event and group", async () => (answers.length >= events.length * INTAKE_GROUPS.length ? true : undefined));
			await sleep(300);
			expect(answers).toEqual(Array(events.length * INTAKE_GROUPS.length).fill("+ACK"));
		} finally {
			if (!persistLock.isCompleted()) await persistLock.rollback();
			watch.unsubscribe();
			await nats.close();
		}
	});

	it("dispatcher.publish hands the event to the notifier through the channel", async () => {
		await optIn(env, "chan-carol");
		const customerId = implicitCustomerId("chan-carol");
		const answer: { event_id: string } = await env.stack.app.broker.call("dispatcher.publish", fulfilledOrder("chan-carol", customerId));
		const [email] = await eventually("the email", async () => {
			const rows = await outboxFor(env, "chan-carol");
			return rows.length ? rows : undefined;
		});
		expect(email.event_id).toBe(answer.event_id);
	});

	it("npm run replay-dead-letters sends dead-lettered events back through the channel, once", async () => {
		const token = await optIn(env, "chan-dave");
		const webhook = await env.createWebhook(token);
		const customerId = implicitCustomerId("chan-dave");
		const event = { ...fulfilledOrder("chan-dave", customerId), event_id: crypto.randomUUID() };
		// As a consumer that gave up on it leaves it: in the dead-letter stream, with its group.
		await deadLetter(producer, namespace, "notifier", event);
		const replay = await runScript(["npm", "run", "-s", "replay-dead-letters"], { TRANSPORTER: TEST_NATS_URL, NAMESPACE: namespace });
		expect(replay).toEqual({ code: 0, output: `Replayed 1 dead-lettered event(s) from ${intakeNames(namespace).deadLetterStream} to ${intakeNames(namespace).subject}\n` });
		await eventually("the delivery", async () => (env.received(webhook).length ? true : undefined));
		const [email] = await eventually("the email", async () => {
			const rows = await outboxFor(env, "chan-dave");
			return rows.length ? rows : undefined;
		});
		expect(email.event_id).toBe(event.event_id);
		expect(await deliveredEventIds(env, webhook.id)).toEqual([event.event_id]);
		// Nothing left to replay.
		expect((await runScript(["npm", "run", "-s", "replay-dead-letters"], { TRANSPORTER: TEST_NATS_URL, NAMESPACE: namespace })).output).toMatch(/^Replayed 0 /);
	});

	it("records an event that can never be valid once per consumer, acknowledges it, and does not see it again", async () => {
		const marker = `bad-${crypto.randomBytes(4).toString("hex")}`;
		await (producer as unknown as { sendToChannel(channel: string, payload: unknown): Promise<void> }).sendToChannel("tasking.order_status", { user_id: marker, status: "teleported" });
		const rejectedBy = async () => ({
			dispatcher: (await env.stack.db("delivery_rejected_events").where("excerpt", "like", `%${marker}%`)).length,
			notifier: (await env.stack.db("email_rejected_events").where("payload", "like", `%${marker}%`)).length,
		});
		await eventually("both rejections", async () => {
			const counts = await rejectedBy();
			return counts.dispatcher && counts.notifier ? counts : undefined;
		});
		// Well past an immediate redelivery: still one record each.
		await sleep(3_000);
		expect(await rejectedBy()).toEqual({ dispatcher: 1, notifier: 1 });
		const [row] = await env.stack.db("delivery_rejected_events").where("excerpt", "like", `%${marker}%`);
		expect(row.source).toBe("channel");
	});
});

describe("stableEventId", () => {
	it("is a version 8 UUID fixed by the stream, the sequence and the store time", () => {
		const info = { stream: "s", streamSequence: 42, timestampNanos: 1_700_000_000_000_000_000 };
		expect(stableEventId(info)).toBe(stableEventId({ ...info }));
		expect(stableEventId(info)).not.toBe(stableEventId({ ...info, streamSequence: 43 }));
		// A stream recreated from scratch restarts its sequence, but not its clock.
		expect(stableEventId(info)).not.toBe(stableEventId({ ...info, timestampNanos: info.timestampNanos + 1_000_000 }));
		expect(stableEventId(info)).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
	});
});
