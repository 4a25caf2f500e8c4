// The service as the delivery benchmark deploys it (bench/delivery.ts and its scenarios): its
// processes started fresh on a database and a stream of their own, the webhooks created, and the
// loops that feed it events (the closed loop, and the bare relay beside it for comparison).
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import knex from "knex";
import type { ServiceBroker } from "moleculer";
import { connect } from "nats";
import { generateWebhookSecret } from "../../lib/crypto";
import { TASKING_ORDER_STATUS_TOPIC } from "../../lib/schemas/events";
import type { BacklogDeployment, ServiceNode } from "./backlog";
import { startNatsServer, type NatsEnv } from "../../test/helpers/nats-server";
import { startPostgresServer } from "../../test/helpers/postgres-server";
import { startChild, stopAllChildren, type ChildServer } from "./child";
import { producerBroker, sendVia, serviceNodeEnv } from "./cluster-nodes";
import { monotonicMs } from "./receiver";
import type { Receivers } from "./receivers";

export const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 64);
export const EVENTS = Number(process.env.BENCH_EVENTS ?? 2_000);
export const WARM_UP_EVENTS = 200;
const IN_SYSTEM = 64;
// Latency is measured in this many rounds, relay and dispatcher taking turns, and the samples of
// all rounds are pooled: in one round each, the p99 of the same code swung 2-5x between runs
// (a hiccup of the shared machine lands in one measurement and not the other).
export const LATENCY_ROUNDS = Number(process.env.BENCH_LATENCY_ROUNDS ?? 3);
// The latency load in deliveries per second, instead of half the measured throughput: an A/B of
// two versions then offers both the same load.
export const OFFERED = process.env.BENCH_OFFERED ? Number(process.env.BENCH_OFFERED) : undefined;
export const NATS_URL = process.env.BENCH_NATS_URL ?? "nats://127.0.0.1:4222";
export const DATABASE_URL = process.env.BENCH_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const PROFILE_DIR = process.env.BENCH_PROFILE_DIR;
// Node's own flags for every service node, space-separated, for what NODE_OPTIONS refuses:
// BENCH_NODE_FLAGS="--trace-opt --trace-deopt" (V8's compiler log, on the bench's stderr).
const NODE_FLAGS = (process.env.BENCH_NODE_FLAGS ?? "").split(" ").filter(Boolean);
// The cluster's dispatcher processes (2 by default, the goals' cluster); 1 shows what the second costs.
const CLUSTER_DISPATCHERS = Number(process.env.BENCH_CLUSTER_DISPATCHERS ?? 2);
// Settings for every service node (JSON), for an A/B of one setting: BENCH_SERVICE_ENV='{"DELIVERY_POLL_INTERVAL":"250ms"}'.
const SERVICE_ENV: Record<string, string> = JSON.parse(process.env.BENCH_SERVICE_ENV ?? "{}");
const CUSTOMER = "bench";

const here = (file: string) => path.join(__dirname, file);
// Every database schema and stream of this run is named after it, and removed by it.
const runId = `b${crypto.randomBytes(3).toString("hex")}`;
let deployments = 0;

/** A deployment of the service: what the backlog scenario uses of it, and the producer's broker. */
export interface Deployment extends BacklogDeployment {
	label: string;
	producer: ServiceBroker;
}

export interface DeployOptions {
	engine: "sqlite" | "postgresql";
	cluster?: boolean;
	healthyUrls: string[];
	neighbourUrls?: string[];
	caFile: string;
	env?: Record<string, string>;
	/**
	 * On servers of the deployment's own that take TLS only and verify each client's certificate:
	 * a PostgreSQL (engine postgresql) and a NATS (cluster), instead of DATABASE_URL and NATS_URL.
	 */
	tls?: boolean;
}

interface TlsServers {
	nats?: NatsEnv;
	databaseUrl?: string;
	close(): Promise<void>;
}

// Servers a deployment started (tls), closed by a signal too: PostgreSQL would outlive the run.
const ownServers = new Set<TlsServers>();

// The shared PostgreSQL's settings that a server of the run's own copies, so that TLS is the only
// difference between a mode and its _tls twin.
const COPIED_POSTGRES_SETTINGS = ["autovacuum", "shared_buffers", "max_wal_size", "min_wal_size", "checkpoint_timeout", "synchronous_commit", "fsync", "wal_level"];

async function sharedPostgresSettings(): Promise<Record<string, string>> {
	const db = knex({ client: "pg", connection: DATABASE_URL, pool: { min: 0, max: 1 } });
	try {
		const { rows } = await db.raw<{ rows: Array<{ name: string; setting: string }> }>("SELECT name, setting FROM pg_settings WHERE name = ANY(?)", [COPIED_POSTGRES_SETTINGS]);
		return Object.fromEntries(rows.map(row => [row.name, row.setting]));
	} finally {
		await db.destroy();
	}
}

/** A NATS and a PostgreSQL of the deployment's own, as asked, each taking TLS only. */
async function startTlsServers(want: { nats: boolean; postgresql: boolean }): Promise<TlsServers> {
	const certificates = fs.mkdtempSync(path.join(os.tmpdir(), "swh-bench-tls-"));
	const started: Array<{ close(): Promise<void> }> = [];
	const servers: TlsServers = {
		async close() {
			await Promise.all(started.map(server => server.close()));
			fs.rmSync(certificates, { recursive: true, force: true });
			ownServers.delete(servers);
		},
	};
	ownServers.add(servers);
	try {
		if (want.nats) {
			const nats = await startNatsServer();
			started.push(nats);
			servers.nats = await nats.startTls(certificates);
		}
		if (want.postgresql) {
			const postgres = await startPostgresServer({ mutualTls: true, settings: await sharedPostgresSettings() });
			started.push(postgres);
			const { caFile, certFile, keyFile } = postgres.tls!;
			servers.databaseUrl = `${postgres.url}?${new URLSearchParams({ sslmode: "verify-full", sslrootcert: caFile, sslcert: certFile, sslkey: keyFile })}`;
		}
	} catch (err) {
		await servers.close();
		throw err;
	}
	return servers;
}

/** Starts the service's processes (fresh database, fresh stream) and creates the webhooks. */
export async function deploy(options: DeployOptions): Promise<Deployment> {
	deployments += 1;
	const namespace = `${runId}d${deployments}`;
	const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-bench-"));
	const schema = options.engine === "postgresql" ? `bench_${namespace}` : undefined;
	const tlsServers = options.tls ? await startTlsServers({ nats: Boolean(options.cluster), postgresql: Boolean(schema) }) : undefined;
	const nats = tlsServers?.nats ?? { TRANSPORTER: NATS_URL };
	const databaseUrl = tlsServers?.databaseUrl ?? DATABASE_URL;
	const env: Record<string, string> = {
		...serviceNodeEnv(namespace, nats, dataDir),
		WEBHOOK_ALLOW_NETS: "127.0.0.0/8",
		WEBHOOK_CA_FILE: options.caFile,
		DELIVERY_CONCURRENCY: String(CONCURRENCY),
		...(schema ? { DATABASE_URL: databaseUrl, DATABASE_SCHEMA: schema } : {}),
		...options.env,
		...SERVICE_ENV,
	};
	const nodeOptions = (name: string) => [...NODE_FLAGS, ...(PROFILE_DIR ? ["--cpu-prof", `--cpu-prof-dir=${path.join(PROFILE_DIR, `${namespace}-${name}`)}`] : [])];
	// Each process's start, from spawning it to its report that it is up.
	const startSeconds: Record<string, number> = {};
	const start = async (name: string, services: string) => {
		const spawnedAt = performance.now();
		const child = await startChild<unknown>(here("service-node.ts"), { ...env, SERVICES: services, NODE_ID: `${namespace}-${name}` }, 120_000, nodeOptions(name));
		startSeconds[name] = Math.round(performance.now() - spawnedAt) / 1000;
		return child;
	};
	// The producer first: "after start" is about the service's processes, not the producer.
	const producer = producerBroker(namespace, nats);
	await producer.start();
	const nodes: ServiceNode[] = [];
	const dispatchers: Array<ChildServer<unknown>> = [];
	try {
		if (options.cluster) {
			// The roles of a real cluster: the notifier takes every event from the channel too,
			// though the bench's users want no email.
			nodes.push({ role: "gateway", server: await start("gateway", "topics,webhooks,users") }, { role: "notifier", server: await start("notifier", "notifier") });
			// One after the other: two processes migrating a fresh schema at once can collide.
			for (let i = 1; i <= CLUSTER_DISPATCHERS; i++) dispatchers.push(await start(`dispatcher-${i}`, "dispatcher"));
		} else {
			dispatchers.push(await start("all", "topics,webhooks,users,dispatcher"));
		}
		nodes.push(...dispatchers.map(server => ({ role: options.cluster ? ("dispatchers" as const) : ("all" as const), server })));
	} catch (err) {
		await Promise.all([...nodes.map(node => node.server), ...dispatchers].map(node => node.stop()));
		await producer.stop();
		await tlsServers?.close();
		throw err;
	}
	await producer.waitForServices(["webhooks", "dispatcher", ...(options.cluster ? ["notifier"] : [])], 60_000);
	const create = (url: string, i: number) =>
		producer.call<{ id: string }, object>("webhooks.create", { name: `bench-${i}`, url, events: [TASKING_ORDER_STATUS_TOPIC] }, { meta: { customerId: CUSTOMER } });
	const healthy = [];
	for (const [i, url] of options.healthyUrls.entries()) healthy.push(await create(url, i));
	for (const [i, url] of (options.neighbourUrls ?? []).entries()) await create(url, 100 + i);
	const db = schema
		? knex({ client: "pg", connection: databaseUrl, searchPath: [schema], pool: { min: 0, max: 2 } })
		: knex({ client: "better-sqlite3", connection: { filename: path.join(dataDir, "service.sqlite") }, useNullAsDefault: true });
	return {
		label: namespace,
		engine: options.engine,
		cluster: Boolean(options.cluster),
		nats,
		producer,
		dispatchers,
		nodes,
		db,
		healthyIds: healthy.map(webhook => webhook.id),
		startSeconds,
		send: sendVia(producer),
		async stop() {
			await producer.stop();
			await Promise.all(dispatchers.map(node => node.stop()));
			await Promise.all(nodes.filter(node => !dispatchers.includes(node.server)).map(node => node.server.stop()));
			// BENCH_KEEP_DATA=1 keeps the SQLite files (and prints where), to look at the timestamps;
			// not a _tls mode's servers, which are the deployment's own.
			if (process.env.BENCH_KEEP_DATA && !tlsServers) {
				process.stderr.write(`bench delivery: kept ${schema ? `schema ${schema}` : dataDir}\n`);
				await db.destroy();
				return;
			}
			if (schema) await db.raw(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
			await db.destroy();
			await tlsServers?.close();
			fs.rmSync(dataDir, { recursive: true, force: true });
		},
	};
}

let eventSeq = 0;
export function orderEvent(extra: Record<string, unknown> = {}) {
	eventSeq += 1;
	return { customer_id: CUSTOMER, user_id: "bench-user", order_id: `order-${runId}-${eventSeq}`, status: "fulfilled", order_name: "Benchmark order", details: extra };
}

async function succeededOf(deployment: Pick<Deployment, "db" | "healthyIds">): Promise<number> {
	const [{ count }] = await deployment.db("deliveries").where({ status: "succeeded" }).whereIn("webhook_id", deployment.healthyIds).count({ count: "*" });
	return Number(count);
}

/**
 * Sends `events` with at most IN_SYSTEM of them not yet delivered, and waits until the receivers
 * have answered every one of their `healthy` deliveries and `persisted` (when given) has seen
 * them recorded. Returns healthy deliveries per second.
 */
export async function closedLoopRate(send: (event: object) => Promise<void>, receivers: Receivers, events: number, healthy: number, persisted?: (expected: number) => Promise<void>): Promise<number> {
	const baseOk = receivers.ok;
	const started = monotonicMs();
	let next = 0;
	const publisher = async () => {
		while (next < events) {
			const i = next++;
			await receivers.waitForOk(baseOk + (i - IN_SYSTEM + 1) * healthy);
			await send(orderEvent());
		}
	};
	await Promise.all(Array.from({ length: Math.min(IN_SYSTEM, events) }, publisher));
	const expected = events * healthy;
	await receivers.waitForOk(baseOk + expected);
	await persisted?.(expected);
	return expected / ((monotonicMs() - started) / 1000);
}

/** The dispatcher's throughput: a delivery counts once it is recorded as succeeded. */
export async function throughput(deployment: Pick<Deployment, "db" | "healthyIds" | "send">, receivers: Receivers, events: number): Promise<number> {
	const baseSucceeded = await succeededOf(deployment);
	return closedLoopRate(deployment.send, receivers, events, deployment.healthyIds.length, async expected => {
		while ((await succeededOf(deployment)) < baseSucceeded + expected) await sleep(5);
	});
}

/** Runs `work` against a bare relay started now, fed through a channel of its own. */
export async function withRelay<T>(targets: Array<{ url: string }>, ca: string, work: (send: (event: object) => Promise<void>, relay: ChildServer<unknown>) => Promise<T>): Promise<T> {
	deployments += 1;
	const namespace = `${runId}r${deployments}`;
	// The producer first, as in deploy(): "after start" is about the relay, not the producer.
	const producer = producerBroker(namespace, { TRANSPORTER: NATS_URL });
	await producer.start();
	let relay: ChildServer<unknown> | undefined;
	try {
		relay = await startChild<unknown>(here("relay-node.ts"), {
			TRANSPORTER: NATS_URL,
			NAMESPACE: namespace,
			RELAY_CA: ca,
			RELAY_TARGETS: JSON.stringify(targets.map(target => ({ url: target.url, secret: generateWebhookSecret() }))),
		});
		return await work(sendVia(producer), relay);
	} finally {
		await relay?.stop();
		await producer.stop();
	}
}

/** A PostgreSQL schema name of this run's, which removeRunLeftovers finds by its prefix. */
export function runSchemaName(suffix: string): string {
	return `bench_${runId}${suffix}`;
}

/**
 * Drops every schema and deletes every stream this run made. A run's own steps remove what they
 * made as they finish; this is for a run stopped by a signal, which would otherwise leave them on
 * the shared servers. Stop the service's processes first: they hold the schemas' tables.
 */
export async function removeRunLeftovers(): Promise<void> {
	await removeStreams();
	const db = knex({ client: "pg", connection: DATABASE_URL, pool: { min: 0, max: 1 } });
	try {
		const { rows } = await db.raw<{ rows: Array<{ nspname: string }> }>("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, ?)", [runSchemaName("")]);
		for (const { nspname } of rows) await db.raw(`DROP SCHEMA IF EXISTS "${nspname}" CASCADE`);
	} finally {
		await db.destroy();
	}
}

/**
 * Until the returned function is called, Ctrl-C or SIGTERM stops the run's processes, removes its
 * schemas and streams, and exits 130 or 143. The returned function, called where the run ends
 * (its finally), waits for that clean-up if a signal came, so that the run's own failure, which
 * its stopped processes cause, cannot exit first.
 */
export function removeLeftoversOnSignal(): () => Promise<void> {
	process.stderr.write(`bench delivery: run ${runId}: its schemas are named bench_${runId}…, its streams ${runId}…\n`);
	let cleaningUp: Promise<void> | undefined;
	const onSignal = (signal: NodeJS.Signals) => {
		process.stderr.write(`bench delivery: ${signal}: stopping the run's processes, removing its schemas and streams\n`);
		cleaningUp ??= stopAllChildren()
			.then(() => Promise.all([...ownServers].map(servers => servers.close())))
			.then(removeRunLeftovers)
			.catch(err => process.stderr.write(`bench delivery: could not remove the run's schemas and streams: ${String(err)}\n`))
			.then(() => process.exit(128 + os.constants.signals[signal]));
	};
	process.on("SIGINT", onSignal);
	process.on("SIGTERM", onSignal);
	return async () => {
		if (cleaningUp) await cleaningUp;
		process.off("SIGINT", onSignal);
		process.off("SIGTERM", onSignal);
	};
}

/** Deletes the JetStream streams this run made. */
export async function removeStreams(): Promise<void> {
	const nats = await connect({ servers: new URL(NATS_URL).host });
	try {
		const manager = await nats.jetstreamManager();
		for await (const stream of manager.streams.list()) {
			if (stream.config.name.startsWith(runId)) await manager.streams.delete(stream.config.name);
		}
	} finally {
		await nats.close();
	}
}
