// Delivery benchmark (npm run bench, "delivery" part; or `tsx bench/delivery.ts` alone).
//
// Every role runs as a process of its own, as in production: the receivers (one HTTPS port per
// endpoint, bench/lib/receiver.ts), the service nodes (bench/lib/service-node.ts, the app as
// `npm start` or `npm run cluster` runs it) and the bare relay (bench/lib/relay-node.ts). This
// process is the outside producer: a Moleculer node sending `tasking.order_status` events to
// the durable JetStream channel, as the producer example of docs/delivery.md does.
//
// 1. Floor: the fastest plain loop of signed POSTs we can write (undici, node:crypto HMAC over
//    the bytes sent), CONCURRENCY at a time spread over the healthy endpoints, no broker, no
//    database. Measured before and after everything else; the mean is the floor.
// 2. Throughput: EVENTS events × HEALTHY webhooks of one customer, at most IN_SYSTEM events not
//    yet delivered, counted until every delivery is recorded as succeeded in the database. The
//    bare relay runs the same loop once per run, as a reference beside the floor.
// 3. Latency, event sent → request arriving at the receiver, open loop at half the measured
//    throughput, on a freshly started node: the first START_SECONDS, then STEADY_SECONDS of
//    steady state (bench/lib/latency.ts). The same load through the bare relay gives the
//    comparison. LATENCY_ROUNDS rounds, relay and dispatcher alternating, each on a fresh start;
//    the samples are pooled.
// Scenarios: SQLite (one node, embedded database), PostgreSQL (one node), cluster (a gateway
// node, a notifier and two dispatcher processes on PostgreSQL), bad neighbours (SQLite: the healthy
// webhooks with and without one endpoint answering after 100 ms and one always answering 500,
// whose retries are due all the time), backlog (open-loop bursts, cold and warm, small and
// large, with millions of deliveries pending: bench/lib/backlog.ts), ratelimit (one webhook limited
// to 50/s beside the unlimited ones, with it and without it: bench/lib/rate-limit.ts), tracing (SQLite, one
// node: throughput with OpenTelemetry traces on, every trace sampled and exported to a local
// OTLP/HTTP sink, against tracing off, TRACING_ROUNDS rounds of each taking turns), and ordering
// (what ordering per order costs, on receivers of its own: bench/lib/ordering.ts). A run of
// ordering or ratelimit alone measures no floor.
//
// BENCH_SCENARIOS=sqlite,postgresql,cluster,neighbours,backlog,tracing,ordering,ratelimit picks scenarios
// (all but tracing and ratelimit by default); BENCH_PROFILE_DIR=<dir>
// runs the service nodes with --cpu-prof into that folder; BENCH_SAMPLES_FILE=<file> appends each
// latency round's samples ([sent at, ms], monotonic clock) as a JSON line; BENCH_OFFERED fixes the
// latency load (deliveries/s); BENCH_SERVICE_ENV adds settings to every service node (JSON).
// BENCH_DATABASE_URL is the PostgreSQL server (default
// postgres://postgres@127.0.0.1:5432/test), BENCH_NATS_URL the NATS server.
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import knex from "knex";
import { ServiceBroker } from "moleculer";
import { connect } from "nats";
import { Agent } from "undici";
import { generateWebhookSecret } from "../lib/crypto";
import { testCertificate } from "../test/helpers/https-receiver";
import { startChild, type ChildServer } from "./lib/child";
import { startOtlpSink } from "./lib/otlp-sink";
import { probe, probeAll, producerBroker, sendVia, serviceNodeEnv, type Probe } from "./lib/cluster-nodes";
import { monotonicMs, type ReceiverReady } from "./lib/receiver";
import { Receivers } from "./lib/receivers";
import { againstFloor, backlogScenario, type BacklogDeployment, type BacklogHarness } from "./lib/backlog";
import { orderingScenario } from "./lib/ordering";
import { rateLimitScenario } from "./lib/rate-limit";
import { concurrentLoops, floorBody, keyOf, signedPost, type SignedTarget } from "./lib/signed-post";
import { latencyRound, pooled, type LatencyRound } from "./lib/latency";
import { mean, round } from "./lib/stats";

const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 64);
const HEALTHY = 10;
const EVENTS = Number(process.env.BENCH_EVENTS ?? 2_000);
const WARM_UP_EVENTS = 200;
const FLOOR_REQUESTS = 20_000;
const IN_SYSTEM = 64;
// Latency is measured in this many rounds, relay and dispatcher taking turns, and the samples of
// all rounds are pooled: in one round each, the p99 of the same code swung 2-5x between runs
// (a hiccup of the shared machine lands in one measurement and not the other).
const LATENCY_ROUNDS = Number(process.env.BENCH_LATENCY_ROUNDS ?? 3);
// Throughput with tracing on and off, measured this many times each, taking turns.
const TRACING_ROUNDS = Number(process.env.BENCH_TRACING_ROUNDS ?? 2);
const GOALS = { throughput_ratio: 0.5, throughput_ratio_stretch: 0.8, p99_vs_relay: 2, neighbours_within: 0.2 };
const NATS_URL = process.env.BENCH_NATS_URL ?? "nats://127.0.0.1:4222";
const DATABASE_URL = process.env.BENCH_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const SCENARIOS = (process.env.BENCH_SCENARIOS ?? "sqlite,postgresql,cluster,neighbours,backlog,ordering").split(",");
// The ordering and ratelimit scenarios' figures are ratios within themselves: run alone, they need no floor.
const NEEDS_FLOOR = SCENARIOS.some(scenario => scenario !== "ordering" && scenario !== "ratelimit");
const PROFILE_DIR = process.env.BENCH_PROFILE_DIR;
// The latency load in deliveries per second, instead of half the measured throughput: an A/B of
// two versions then offers both the same load.
const OFFERED = process.env.BENCH_OFFERED ? Number(process.env.BENCH_OFFERED) : undefined;
// Settings for every service node (JSON), for an A/B of one setting: BENCH_SERVICE_ENV='{"DELIVERY_POLL_INTERVAL":"250ms"}'.
const SERVICE_ENV: Record<string, string> = JSON.parse(process.env.BENCH_SERVICE_ENV ?? "{}");
const CUSTOMER = "bench";
const TOPIC = "tasking:order_status";
// The failing neighbour is retried every 250 ms for a minute: retries are due all the time.
const FAST_RETRIES = Array.from({ length: 240 }, (_, i) => `${(i + 1) * 250}ms`).join(",");

const sleep = (ms: number) => new Promise(resolve => setTimeout(resolve, ms));
const here = (file: string) => path.join(__dirname, "lib", file);
const runId = `b${crypto.randomBytes(3).toString("hex")}`;
let deployments = 0;

/** The fastest plain loop of signed POSTs: CONCURRENCY loops, each on one endpoint. */
async function floor(targets: SignedTarget[], ca: string, receivers: Receivers): Promise<{ rate: number; client_cores: number; receiver_cores: number }> {
	const agent = new Agent({ connections: CONCURRENCY, connect: { ca } });
	const run = (count: number) =>
		concurrentLoops(targets, count, CONCURRENCY, async (target, i) => {
			const status = await signedPost(agent, target, Buffer.from(floorBody(i)));
			if (status !== 200) throw new Error(`floor got HTTP ${status}`);
		});
	await run(FLOOR_REQUESTS / 4); // warm-up: connections, JIT
	const before = receivers.ok;
	await probe(receivers.child);
	const cpu = process.cpuUsage();
	const started = monotonicMs();
	await run(FLOOR_REQUESTS);
	const seconds = (monotonicMs() - started) / 1000;
	const used = process.cpuUsage(cpu);
	const receiver = await probe(receivers.child);
	await agent.close();
	if (receivers.ok - before < FLOOR_REQUESTS) await receivers.waitForOk(before + FLOOR_REQUESTS);
	return { rate: FLOOR_REQUESTS / seconds, client_cores: round((used.user + used.system) / 1e6 / seconds), receiver_cores: receiver.cpu_cores };
}

/** A deployment of the service: what the backlog scenario uses of it, and the producer's broker. */
interface Deployment extends BacklogDeployment {
	label: string;
	producer: ServiceBroker;
}

interface DeployOptions {
	engine: "sqlite" | "postgresql";
	cluster?: boolean;
	healthyUrls: string[];
	neighbourUrls?: string[];
	caFile: string;
	env?: Record<string, string>;
}

/** Starts the service's processes (fresh database, fresh stream) and creates the webhooks. */
async function deploy(options: DeployOptions): Promise<Deployment> {
	deployments += 1;
	const namespace = `${runId}d${deployments}`;
	const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-bench-"));
	const schema = options.engine === "postgresql" ? `bench_${namespace}` : undefined;
	const env: Record<string, string> = {
		...serviceNodeEnv(namespace, NATS_URL, dataDir),
		WEBHOOK_ALLOW_NETS: "127.0.0.0/8",
		WEBHOOK_CA_FILE: options.caFile,
		DELIVERY_CONCURRENCY: String(CONCURRENCY),
		...(schema ? { DATABASE_URL, DATABASE_SCHEMA: schema } : {}),
		...options.env,
		...SERVICE_ENV,
	};
	const nodeOptions = (name: string) => (PROFILE_DIR ? ["--cpu-prof", `--cpu-prof-dir=${path.join(PROFILE_DIR, `${namespace}-${name}`)}`] : []);
	const start = (name: string, services: string) => startChild<unknown>(here("service-node.ts"), { ...env, SERVICES: services, NODE_ID: `${namespace}-${name}` }, 120_000, nodeOptions(name));
	// The producer first: "after start" is about the service's processes, not the producer.
	const producer = producerBroker(namespace, NATS_URL);
	await producer.start();
	const nodes: Array<ChildServer<unknown>> = [];
	const nodeRoles: string[] = [];
	const dispatchers: Array<ChildServer<unknown>> = [];
	try {
		if (options.cluster) {
			// The roles of a real cluster: the notifier takes every event from the channel too,
			// though the bench's users want no email.
			nodes.push(await start("gateway", "topics,webhooks,users"), await start("notifier", "notifier"));
			nodeRoles.push("gateway", "notifier");
			// One after the other: two processes migrating a fresh schema at once can collide.
			for (const name of ["dispatcher-1", "dispatcher-2"]) dispatchers.push(await start(name, "dispatcher"));
		} else {
			dispatchers.push(await start("all", "topics,webhooks,users,dispatcher"));
		}
		nodes.push(...dispatchers);
		nodeRoles.push(...dispatchers.map(() => (options.cluster ? "dispatchers" : "all")));
	} catch (err) {
		await Promise.all([...nodes, ...dispatchers].map(node => node.stop()));
		await producer.stop();
		throw err;
	}
	await producer.waitForServices(["webhooks", "dispatcher", ...(options.cluster ? ["notifier"] : [])], 60_000);
	const create = (url: string, i: number) =>
		producer.call<{ id: string }, object>("webhooks.create", { name: `bench-${i}`, url, events: [TOPIC] }, { meta: { customerId: CUSTOMER } });
	const healthy = [];
	for (const [i, url] of options.healthyUrls.entries()) healthy.push(await create(url, i));
	for (const [i, url] of (options.neighbourUrls ?? []).entries()) await create(url, 100 + i);
	const db = schema
		? knex({ client: "pg", connection: DATABASE_URL, searchPath: [schema], pool: { min: 0, max: 2 } })
		: knex({ client: "better-sqlite3", connection: { filename: path.join(dataDir, "service.sqlite") }, useNullAsDefault: true });
	return {
		label: namespace,
		engine: options.engine,
		cluster: Boolean(options.cluster),
		producer,
		dispatchers,
		nodes,
		nodeRoles,
		db,
		healthyIds: healthy.map(webhook => webhook.id),
		send: sendVia(producer),
		async stop() {
			await producer.stop();
			await Promise.all(dispatchers.map(node => node.stop()));
			await Promise.all(nodes.filter(node => !dispatchers.includes(node)).map(node => node.stop()));
			// BENCH_KEEP_DATA=1 keeps the SQLite files (and prints where), to look at the timestamps.
			if (process.env.BENCH_KEEP_DATA) {
				process.stderr.write(`bench delivery: kept ${schema ? `schema ${schema}` : dataDir}\n`);
				await db.destroy();
				return;
			}
			if (schema) await db.raw(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
			await db.destroy();
			fs.rmSync(dataDir, { recursive: true, force: true });
		},
	};
}

let eventSeq = 0;
function orderEvent(extra: Record<string, unknown> = {}) {
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
async function closedLoopRate(send: (event: object) => Promise<void>, receivers: Receivers, events: number, healthy: number, persisted?: (expected: number) => Promise<void>): Promise<number> {
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
async function throughput(deployment: Pick<Deployment, "db" | "healthyIds" | "send">, receivers: Receivers, events: number): Promise<number> {
	const baseSucceeded = await succeededOf(deployment);
	return closedLoopRate(deployment.send, receivers, events, deployment.healthyIds.length, async expected => {
		while ((await succeededOf(deployment)) < baseSucceeded + expected) await sleep(5);
	});
}

/** Runs `work` against a bare relay started now, fed through a channel of its own. */
async function withRelay<T>(targets: Array<{ url: string }>, ca: string, work: (send: (event: object) => Promise<void>, relay: ChildServer<unknown>) => Promise<T>): Promise<T> {
	deployments += 1;
	const namespace = `${runId}r${deployments}`;
	// The producer first, as in deploy(): "after start" is about the relay, not the producer.
	const producer = producerBroker(namespace, NATS_URL);
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

/** The bare relay, started now, under the same open-loop load. */
function relayLatency(targets: Array<{ url: string }>, ca: string, receivers: Receivers, eventsPerSecond: number): Promise<LatencyRound> {
	return withRelay(targets, ca, (send, relay) => latencyRound(send, orderEvent, [relay], receivers, eventsPerSecond, targets.length));
}

/**
 * The bare relay under the throughput loop: what a sender fed through the broker reaches on this
 * machine with no database at all. Its CPU per delivery (the channel, the event's JSON) is part
 * of any dispatcher's too, so on a machine whose cores are all busy it bounds the ratio.
 */
function relayThroughput(targets: Array<{ url: string }>, ca: string, receivers: Receivers): Promise<number> {
	return withRelay(targets, ca, async send => {
		await closedLoopRate(send, receivers, WARM_UP_EVENTS, targets.length);
		return closedLoopRate(send, receivers, EVENTS, targets.length);
	});
}

function ratioOf(value: number, reference: number): number {
	return round(value / reference, 2);
}

function cpuPerDelivery(dispatchers: Probe[], relay: Probe[], deliveriesPerSecond: number) {
	const perDelivery = (probes: Probe[]) => (probes.reduce((sum, probe) => sum + probe.cpu_cores, 0) / deliveriesPerSecond) * 1e6;
	return { dispatcher: round(perDelivery(dispatchers)), relay: round(perDelivery(relay)), ratio: ratioOf(perDelivery(dispatchers), perDelivery(relay)) };
}

interface EngineOptions {
	engine: "sqlite" | "postgresql";
	cluster?: boolean;
}

async function engineScenario(options: EngineOptions, healthyUrls: string[], caFile: string, ca: string, receivers: Receivers) {
	let deployment = await deploy({ ...options, healthyUrls, caFile });
	let rate: number;
	let loop: Probe[];
	try {
		await throughput(deployment, receivers, WARM_UP_EVENTS);
		await probeAll([...deployment.nodes, receivers.child]);
		rate = await throughput(deployment, receivers, EVENTS);
		loop = await probeAll([...deployment.nodes, receivers.child]);
	} finally {
		await deployment.stop();
	}
	const eventsPerSecond = (OFFERED ?? rate / 2) / HEALTHY;
	const relayRounds: LatencyRound[] = [];
	const dispatcherRounds: LatencyRound[] = [];
	for (let turn = 0; turn < LATENCY_ROUNDS; turn++) {
		relayRounds.push(await relayLatency(healthyUrls.map(url => ({ url })), ca, receivers, eventsPerSecond));
		deployment = await deploy({ ...options, healthyUrls, caFile });
		try {
			dispatcherRounds.push(await latencyRound(deployment.send, orderEvent, deployment.dispatchers, receivers, eventsPerSecond, HEALTHY));
		} finally {
			await deployment.stop();
		}
	}
	const relay = pooled(relayRounds);
	const dispatcher = pooled(dispatcherRounds);
	return {
		dispatchers: deployment.dispatchers.length,
		deliveries_per_s: round(rate),
		/** Set once the floor has been measured again at the end. */
		throughput_ratio: NaN,
		/** The same throughput ÷ the bare relay's (relay_throughput). */
		throughput_vs_relay: NaN,
		// One entry per process: the service's nodes (gateway and notifier first in the cluster), then the receivers.
		event_loop_during_throughput: loop,
		latency: {
			offered_deliveries_per_s: round(eventsPerSecond * HEALTHY),
			rounds: LATENCY_ROUNDS,
			relay,
			dispatcher,
			p99_vs_relay_steady: ratioOf(dispatcher.steady.p99_ms, relay.steady.p99_ms),
			p99_vs_relay_start: ratioOf(dispatcher.start.p99_ms, relay.start.p99_ms),
			// CPU time per delivery in steady state (all threads of the dispatcher processes; in the
			// cluster not the gateway, PostgreSQL or NATS): steadier from run to run than the p99.
			cpu_us_per_delivery_steady: cpuPerDelivery(dispatcher.steady.event_loop, relay.steady.event_loop, eventsPerSecond * HEALTHY),
		},
	};
}

async function neighboursScenario(healthyUrls: string[], neighbourUrls: string[], caFile: string, receivers: Receivers) {
	const measure = async (withNeighbours: boolean, eventsPerSecond?: number) => {
		const deployment = await deploy({ engine: "sqlite", healthyUrls, neighbourUrls: withNeighbours ? neighbourUrls : [], caFile, env: { DELIVERY_RETRY_SCHEDULE: FAST_RETRIES } });
		try {
			await throughput(deployment, receivers, WARM_UP_EVENTS);
			const slowBefore = receivers.slow;
			const failBefore = receivers.fail;
			const rate = await throughput(deployment, receivers, EVENTS);
			// Counted here: the latency rounds below keep the neighbours answering.
			const neighbourAnswers = { slow: receivers.slow - slowBefore, failing: receivers.fail - failBefore };
			const perSecond = eventsPerSecond ?? (OFFERED ?? rate / 2) / healthyUrls.length;
			// Steady state only, so the rounds can share the deployment.
			const rounds: LatencyRound[] = [];
			for (let turn = 0; turn < LATENCY_ROUNDS; turn++) rounds.push(await latencyRound(deployment.send, orderEvent, deployment.dispatchers, receivers, perSecond, healthyUrls.length));
			const { steady, lost, rounds_p99_ms } = pooled(rounds);
			return { healthy_deliveries_per_s: round(rate), steady, steady_rounds_p99_ms: rounds_p99_ms.steady, lost, neighbour_answers_during_throughput: neighbourAnswers, perSecond };
		} finally {
			await deployment.stop();
		}
	};
	const without = await measure(false);
	const withNeighbours = await measure(true, without.perSecond);
	return {
		healthy_webhooks: healthyUrls.length,
		offered_deliveries_per_s: round(without.perSecond * healthyUrls.length),
		without: { ...without, perSecond: undefined },
		with: { ...withNeighbours, perSecond: undefined },
		healthy_throughput_with_vs_without: ratioOf(withNeighbours.healthy_deliveries_per_s, without.healthy_deliveries_per_s),
		healthy_p99_with_vs_without: ratioOf(withNeighbours.steady.p99_ms, without.steady.p99_ms),
	};
}

/**
 * Throughput with traces on (sampler always_on, exporting over OTLP/HTTP protobuf to a local
 * sink) against traces off, on fresh SQLite nodes, the rounds taking turns so that the machine's
 * drift lands on both. The producer sends no traceparent: each event's trace starts at the
 * dispatcher's consumption of the channel message, and its attempts are spans of it.
 */
async function tracingScenario(healthyUrls: string[], caFile: string, receivers: Receivers) {
	const sink = await startOtlpSink();
	const tracingOn = { OTEL_EXPORTER_OTLP_ENDPOINT: sink.url, OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf", OTEL_TRACES_SAMPLER: "always_on" };
	const rates: { off: number[]; on: number[] } = { off: [], on: [] };
	try {
		for (let turn = 0; turn < TRACING_ROUNDS; turn++) {
			for (const mode of ["off", "on"] as const) {
				const deployment = await deploy({ engine: "sqlite", healthyUrls, caFile, env: mode === "on" ? tracingOn : {} });
				try {
					await throughput(deployment, receivers, WARM_UP_EVENTS);
					rates[mode].push(await throughput(deployment, receivers, EVENTS));
				} finally {
					await deployment.stop();
				}
			}
		}
	} finally {
		await sink.close();
	}
	return {
		rounds: TRACING_ROUNDS,
		deliveries_per_s_off: rates.off.map(round),
		deliveries_per_s_on: rates.on.map(round),
		throughput_on_vs_off: ratioOf(mean(rates.on), mean(rates.off)),
		goal_on_vs_off: 0.9,
		exported: { requests: sink.requests, kib: round(sink.bytes / 1024) },
	};
}

function machineOf(loadBefore: number[]) {
	return { cpus: os.cpus().length, model: os.cpus()[0]?.model, node: process.version, loadavg_before: loadBefore.map(v => round(v)), loadavg_after: os.loadavg().map(v => round(v)) };
}

async function removeStreams(): Promise<void> {
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

export async function run(): Promise<object> {
	const { key, cert } = testCertificate();
	const caDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-bench-ca-"));
	const caFile = path.join(caDir, "ca.pem");
	fs.writeFileSync(caFile, cert);
	const kinds = [...Array(HEALTHY).fill("ok"), "slow", "fail"];
	const receivers = new Receivers(await startChild<ReceiverReady>(here("receiver.ts"), { RECEIVER_ENDPOINTS: kinds.join(","), RECEIVER_KEY: key, RECEIVER_CERT: cert }));
	const urls = receivers.ports.map(port => `https://127.0.0.1:${port}/hook`);
	const healthyUrls = urls.slice(0, HEALTHY);
	const floorTargets = healthyUrls.map(url => ({ url, key: keyOf(generateWebhookSecret()) }));
	const loadBefore = os.loadavg();
	const results: Record<string, unknown> = {};
	try {
		const floorBeforeRun = NEEDS_FLOOR ? await floor(floorTargets, cert, receivers) : undefined;
		if (NEEDS_FLOOR) process.stderr.write("bench delivery: relay throughput\n");
		const relayRate = NEEDS_FLOOR ? await relayThroughput(healthyUrls.map(url => ({ url })), cert, receivers) : NaN;
		const pending: Array<{ name: string; figures: { throughput_ratio: number; throughput_vs_relay: number; deliveries_per_s: number } }> = [];
		for (const scenario of SCENARIOS) {
			process.stderr.write(`bench delivery: ${scenario}\n`);
			if (scenario === "sqlite" || scenario === "postgresql") {
				const figures = await engineScenario({ engine: scenario }, healthyUrls, caFile, cert, receivers);
				results[scenario] = figures;
				pending.push({ name: scenario, figures });
			} else if (scenario === "cluster") {
				const figures = await engineScenario({ engine: "postgresql", cluster: true }, healthyUrls, caFile, cert, receivers);
				results.cluster_postgresql = figures;
				pending.push({ name: "cluster_postgresql", figures });
			} else if (scenario === "neighbours") {
				results.neighbours_sqlite = await neighboursScenario(urls.slice(0, 8), urls.slice(HEALTHY), caFile, receivers);
			} else if (scenario === "tracing") {
				results.tracing_sqlite = await tracingScenario(healthyUrls, caFile, receivers);
			} else if (scenario === "backlog") {
				const harness: BacklogHarness = {
					receivers,
					natsUrl: NATS_URL,
					deploy: options => deploy({ ...options, caFile }),
					closedLoop: (deployment, events) => throughput(deployment, receivers, events),
					orderEvent: () => orderEvent(),
					probe: probeAll,
				};
				results.backlog = await backlogScenario(harness, healthyUrls);
			} else if (scenario === "ordering") {
				results.ordering = await orderingScenario({ key, cert, deploy: options => deploy({ ...options, healthyUrls: [], caFile }), probe: probeAll });
			} else if (scenario === "ratelimit") {
				const receiverEnv = { RECEIVER_KEY: key, RECEIVER_CERT: cert };
				const closedLoop = (deployment: Deployment, events: number) => throughput(deployment, receivers, events);
				results.ratelimit = await rateLimitScenario({ receivers, receiverEnv, deploy: options => deploy({ ...options, caFile }), closedLoop, orderEvent }, healthyUrls);
			} else {
				throw new Error(`unknown scenario ${scenario}`);
			}
		}
		if (!floorBeforeRun) return { machine: machineOf(loadBefore), ...results };
		const floorAfterRun = await floor(floorTargets, cert, receivers);
		// The ratios use the mean of the floor before and after: the machine's other load drifts.
		const floorRate = (floorBeforeRun.rate + floorAfterRun.rate) / 2;
		for (const { figures } of pending) {
			figures.throughput_ratio = ratioOf(figures.deliveries_per_s, floorRate);
			figures.throughput_vs_relay = ratioOf(figures.deliveries_per_s, relayRate);
		}
		if (results.backlog) {
			// The raw loop's CPU per delivery: the floor's client and receivers, before and after.
			const rawUs = mean([floorBeforeRun, floorAfterRun].map(f => ((f.client_cores + f.receiver_cores) / f.rate) * 1e6));
			results.backlog = againstFloor(results.backlog as Awaited<ReturnType<typeof backlogScenario>>, floorRate, rawUs);
		}
		return {
			machine: machineOf(loadBefore),
			concurrency: CONCURRENCY,
			webhooks: HEALTHY,
			events: EVENTS,
			goals: GOALS,
			floor: {
				deliveries_per_s: round(floorRate),
				before_after: [round(floorBeforeRun.rate), round(floorAfterRun.rate)],
				// CPU of the client loop and of the receivers while the floor ran: 1 = one whole core.
				cores_before: { client: floorBeforeRun.client_cores, receivers: floorBeforeRun.receiver_cores },
				cores_after: { client: floorAfterRun.client_cores, receivers: floorAfterRun.receiver_cores },
			},
			// The same throughput loop through the bare relay (no database): a reference, not the floor.
			relay_throughput: { deliveries_per_s: round(relayRate), ratio_to_floor: ratioOf(relayRate, floorRate) },
			...results,
		};
	} finally {
		await receivers.stop();
		await removeStreams().catch(err => process.stderr.write(`could not remove the benchmark's streams: ${String(err)}\n`));
		fs.rmSync(caDir, { recursive: true, force: true });
	}
}

if (require.main === module) {
	run().then(
		result => {
			process.stdout.write(`${JSON.stringify({ delivery: result }, null, 2)}\n`);
			process.exit(0);
		},
		err => {
			process.stderr.write(`delivery benchmark failed: ${err instanceof Error ? err.stack : String(err)}\n`);
			process.exit(1);
		},
	);
}
