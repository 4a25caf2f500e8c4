// Notifier benchmark (`npm run bench -- notifier`): what an order-status event that sends no
// email costs. The cluster's shape: a notifier process and a users process (topics, users) on
// PostgreSQL, joined over NATS; the parent is the outside producer, sending events to the durable
// JetStream channel. The events are all email-worthy (fulfilled) and all of one user who never
// turned email on, the commonest case in production.
//
// After a warm-up, BENCH_NOTIFIER_EVENTS events (default 5,000) are sent BENCH_NOTIFIER_SENDERS
// at a time; the measurement ends once the notifier's consumer has acknowledged every one and no
// outbox row is pending. CPU is read over that window: each process's own (user + system, from
// the child), and PostgreSQL's and nats-server's from /proc. Both are shared by everyone on the
// machine (their figures include other sessions' work in the window), so read several runs' ranges. The goal: the notifier plus PostgreSQL ≤ 100 µs per event.
//
// BENCH_DATABASE_URL names PostgreSQL (default postgres://postgres@127.0.0.1:5432/test),
// BENCH_NATS_URL the NATS server with JetStream (default nats://127.0.0.1:4222).
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import knex from "knex";
import { connect } from "nats";
import { intakeNames } from "../lib/intake-channel";
import { startChild, type ChildServer } from "./lib/child";
import { probeAll, producerBroker, sendVia, serviceNodeEnv } from "./lib/cluster-nodes";
import { BROKER_PROCESSES, DATABASE_PROCESSES, cpuSecondsBetween, cpuSecondsByPid } from "./lib/process-cpu";
import { monotonicMs } from "./lib/receiver";
import { round } from "./lib/stats";

const EVENTS = Number(process.env.BENCH_NOTIFIER_EVENTS ?? 5_000);
const WARM_UP_EVENTS = Math.min(500, EVENTS);
const SENDERS = Number(process.env.BENCH_NOTIFIER_SENDERS ?? 32);
const NATS_URL = process.env.BENCH_NATS_URL ?? "nats://127.0.0.1:4222";
const DATABASE_URL = process.env.BENCH_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const GOAL_US_PER_EVENT = 100;
const QUIET_USER = "bench-quiet-user";
const CUSTOMER = "bench";
// A stall turns into an error rather than a hung benchmark: a minute, plus 10 ms per event.
const boundMs = (events: number) => 60_000 + 10 * events;

export async function run(): Promise<object> {
	const namespace = `bn${crypto.randomBytes(3).toString("hex")}`;
	const schema = `bench_${namespace}`;
	const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-bench-"));
	const env: Record<string, string> = { ...serviceNodeEnv(namespace, { TRANSPORTER: NATS_URL }, dataDir), DATABASE_URL, DATABASE_SCHEMA: schema };
	const db = knex({ client: "pg", connection: DATABASE_URL, searchPath: [schema], pool: { min: 0, max: 2 } });
	const nats = await connect({ servers: new URL(NATS_URL).host });
	const names = intakeNames(namespace);
	const producer = producerBroker(namespace, { TRANSPORTER: NATS_URL });
	const nodes: Array<ChildServer<unknown>> = [];
	try {
		await producer.start();
		const start = (name: string, services: string) => startChild<unknown>(path.join(__dirname, "lib", "service-node.ts"), { ...env, SERVICES: services, NODE_ID: `${namespace}-${name}` });
		// One after the other: two processes migrating a fresh schema at once can collide.
		nodes.push(await start("users", "topics,users"));
		nodes.push(await start("notifier", "notifier"));
		await producer.waitForServices(["users", "notifier"], 60_000);
		// Known to users, with an address, and email never turned on.
		await producer.call("users.touch", { userId: QUIET_USER, customerId: CUSTOMER, name: "Quiet", email: "quiet@example.com", lastLogin: null });

		const send = sendVia(producer);
		const consumer = await nats.jetstreamManager();
		let sent = 0;
		const feed = async (count: number) => {
			let next = 0;
			const sender = async () => {
				while (next < count) {
					next += 1;
					await send({ event_id: crypto.randomUUID(), customer_id: CUSTOMER, user_id: QUIET_USER, order_id: `order-${sent + next}`, status: "fulfilled" });
				}
			};
			await Promise.all(Array.from({ length: SENDERS }, sender));
			sent += count;
		};
		// Done when the notifier acknowledged every event and no outbox row waits for the worker.
		const settled = async (count: number) => {
			const until = monotonicMs() + boundMs(count);
			for (;;) {
				const info = await consumer.consumers.info(names.stream, "notifier");
				const [{ pending }] = await db("email_outbox").where("status", "pending").count({ pending: "*" });
				if (info.num_pending === 0 && info.num_ack_pending === 0 && info.delivered.stream_seq >= sent && Number(pending) === 0) return;
				if (monotonicMs() > until) throw new Error(`the notifier did not settle ${count} events in time`);
				await sleep(50);
			}
		};

		await feed(WARM_UP_EVENTS);
		await settled(WARM_UP_EVENTS);
		await probeAll(nodes, "cpu"); // starts each process's CPU window, without the delay monitor
		const database = cpuSecondsByPid(DATABASE_PROCESSES);
		const natsServer = cpuSecondsByPid(BROKER_PROCESSES);
		const started = monotonicMs();
		await feed(EVENTS);
		await settled(EVENTS);
		const seconds = (monotonicMs() - started) / 1000;
		const [users, notifier] = await probeAll(nodes);
		const perEvent = (cpuSeconds: number) => round((cpuSeconds / EVENTS) * 1e6);
		const notifierUs = perEvent(notifier.cpu_cores * seconds);
		const postgresUs = perEvent(cpuSecondsBetween(database, cpuSecondsByPid(DATABASE_PROCESSES)));
		const outbox: Array<{ status: string; rows: string }> = (await db.raw("SELECT status, count(*) AS rows FROM email_outbox GROUP BY status")).rows;
		return {
			events: EVENTS,
			warm_up_events: WARM_UP_EVENTS,
			seconds: round(seconds),
			events_per_s: round(EVENTS / seconds),
			cpu_us_per_event: {
				notifier: notifierUs,
				postgres: postgresUs,
				notifier_and_postgres: round(notifierUs + postgresUs),
				users: perEvent(users.cpu_cores * seconds),
				nats_server: perEvent(cpuSecondsBetween(natsServer, cpuSecondsByPid(BROKER_PROCESSES))),
			},
			goal_us_per_event: GOAL_US_PER_EVENT,
			outbox_rows: Object.fromEntries(outbox.map(row => [row.status, Number(row.rows)])),
			load_average: os.loadavg().map(value => round(value)),
		};
	} finally {
		await producer.stop();
		await Promise.all(nodes.map(node => node.stop()));
		await db.raw(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => undefined);
		await db.destroy();
		const manager = await nats.jetstreamManager();
		for (const stream of [names.stream, names.deadLetterStream]) await manager.streams.delete(stream).catch(() => undefined);
		await nats.close();
		fs.rmSync(dataDir, { recursive: true, force: true });
	}
}
