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
//    database. Measured before and after everything else; the mean is the floor. When the backlog
//    scenario runs on PostgreSQL, PostgreSQL's persistence floor too (persistence-floor.ts): the
//    least CPU that keeping each delivery and its result in PostgreSQL adds to that loop.
// 2. Throughput: EVENTS events × HEALTHY webhooks of one customer, at most IN_SYSTEM events not
//    yet delivered, counted until every delivery is recorded as succeeded in the database. The
//    bare relay runs the same loop once per run, as a reference beside the floor.
// 3. Latency, event sent → request arriving at the receiver, open loop at half the measured
//    throughput, on a freshly started node: the first START_SECONDS, then STEADY_SECONDS of
//    steady state (bench/lib/latency.ts). The same load through the bare relay gives the
//    comparison. LATENCY_ROUNDS rounds, relay and dispatcher alternating, each on a fresh start;
//    the samples are pooled. Each start then runs a second round once the first has drained
//    (`warm`): the steady state of a running service, without a fresh one's start-up queue.
// Scenarios, the longer ones in bench/lib:
// - sqlite (one node, embedded database), postgresql (one node) and cluster (a gateway node, a
//   notifier and two dispatcher processes on PostgreSQL): the three steps above;
// - neighbours (SQLite: the healthy webhooks alone, beside two neighbours behaving well, and beside
//   the same two misbehaving, one answering slowly and one always answering 500 with its retries
//   due all the time; each webhook on its own origin, and all on one host): neighbours.ts;
// - backlog (open-loop bursts, cold and warm, small and large, with millions of deliveries
//   pending): backlog.ts;
// - ratelimit (one webhook limited to 50/s beside the unlimited ones, with it and without it):
//   rate-limit.ts;
// - tracing (SQLite, one node: throughput with OpenTelemetry traces on, every trace sampled and
//   exported to a local OTLP/HTTP sink, against tracing off, rounds of each taking turns):
//   tracing-scenario.ts;
// - ordering (what ordering per order costs, on receivers of its own): ordering.ts.
// A run of ordering or ratelimit alone measures no floor. The deployments of the service and the
// loops that feed them are in deployment.ts.
//
// BENCH_SCENARIOS=sqlite,postgresql,cluster,neighbours,backlog,tracing,ordering,ratelimit picks scenarios
// (all but tracing and ratelimit by default); BENCH_PROFILE_DIR=<dir>
// runs the service nodes with --cpu-prof into that folder; BENCH_SAMPLES_FILE=<file> appends each
// latency round's samples ([sent at, ms], monotonic clock) as a JSON line; BENCH_OFFERED fixes the
// latency load (deliveries/s); BENCH_SERVICE_ENV adds settings to every service node (JSON);
// BENCH_CLUSTER_DISPATCHERS sets the cluster's dispatcher processes (2);
// BENCH_NEIGHBOURS_LAYOUTS picks the neighbours' layouts (own_origins,one_host), BENCH_NEIGHBOURS_TURNS
// how many times their three arms take turns (3).
// BENCH_DATABASE_URL is the PostgreSQL server (default
// postgres://postgres@127.0.0.1:5432/test), BENCH_NATS_URL the NATS server.
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Agent } from "undici";
import { generateWebhookSecret } from "../lib/crypto";
import { testCertificate } from "../test/helpers/https-receiver";
import { startChild } from "./lib/child";
import { probe, probeAll, type Probe } from "./lib/cluster-nodes";
import { closedLoopRate, CONCURRENCY, DATABASE_URL, deploy, type Deployment, EVENTS, LATENCY_ROUNDS, OFFERED, orderEvent, removeLeftoversOnSignal, removeStreams, runSchemaName, throughput, WARM_UP_EVENTS, withRelay } from "./lib/deployment";
import { monotonicMs, type ReceiverReady } from "./lib/receiver";
import { Receivers } from "./lib/receivers";
import { againstFloor, backlogScenario, MODES as BACKLOG_MODES, processesOf, type BacklogHarness } from "./lib/backlog";
import { persistenceFloor, type PersistenceFloor } from "./lib/persistence-floor";
import { neighbourLayouts, neighboursScenario } from "./lib/neighbours";
import { orderingScenario } from "./lib/ordering";
import { rateLimitScenario } from "./lib/rate-limit";
import { concurrentLoops, floorBody, signedPost, type SignedTarget } from "./lib/signed-post";
import { secretKeyOf } from "../lib/signing";
import { latencyRound, pooled, type LatencyRound } from "./lib/latency";
import { ratioOf, round } from "./lib/stats";
import { tracingScenario } from "./lib/tracing-scenario";

const HEALTHY = 10;
// The floor's measured loop; a quarter as many again warm it up first.
const FLOOR_REQUESTS = Number(process.env.BENCH_FLOOR_REQUESTS ?? 20_000);
const GOALS = { throughput_ratio: 0.5, throughput_ratio_stretch: 0.8, p99_vs_relay: 2, neighbours_within: 0.2 };
const SCENARIOS = (process.env.BENCH_SCENARIOS ?? "sqlite,postgresql,cluster,neighbours,backlog,ordering").split(",");
// The ordering and ratelimit scenarios' figures are ratios within themselves: run alone, they need no floor.
const NEEDS_FLOOR = SCENARIOS.some(scenario => scenario !== "ordering" && scenario !== "ratelimit");
// The backlog's PostgreSQL modes are also read against the raw loop plus PostgreSQL's persistence floor.
const NEEDS_PERSISTENCE_FLOOR = SCENARIOS.includes("backlog") && BACKLOG_MODES.some(mode => mode !== "sqlite");
const PERSISTENCE_FLOOR_DELIVERIES = 30_000;

const here = (file: string) => path.join(__dirname, "lib", file);

/** The fastest plain loop of signed POSTs: CONCURRENCY loops, each on one endpoint. */
async function floor(targets: SignedTarget[], ca: string, receivers: Receivers): Promise<{ rate: number; client_cores: number; receiver_cores: number }> {
	const agent = new Agent({ connections: CONCURRENCY, connect: { ca } });
	const run = (count: number) =>
		concurrentLoops(targets, count, CONCURRENCY, async (target, i) => {
			const status = await signedPost(agent, target, Buffer.from(floorBody(i)));
			if (status !== 200) throw new Error(`floor got HTTP ${status}`);
		});
	const atStart = receivers.ok;
	await run(FLOOR_REQUESTS / 4); // warm-up: connections, JIT
	await probe(receivers.child, "cpu");
	const cpu = process.cpuUsage();
	const started = monotonicMs();
	await run(FLOOR_REQUESTS);
	const seconds = (monotonicMs() - started) / 1000;
	const used = process.cpuUsage(cpu);
	const receiver = await probe(receivers.child);
	await agent.close();
	// Every answer counted before returning, the warm-up's too: the receivers report their counts
	// a little late, and a burst measured next would otherwise count the floor's last ones as its own.
	await receivers.waitForOk(atStart + FLOOR_REQUESTS / 4 + FLOOR_REQUESTS);
	return { rate: FLOOR_REQUESTS / seconds, client_cores: round((used.user + used.system) / 1e6 / seconds), receiver_cores: receiver.cpu_cores };
}

/** The raw loop's CPU per delivery: the floor's client and receivers together. */
function rawLoopUsOf(floorRun: { rate: number; client_cores: number; receiver_cores: number }): number {
	return ((floorRun.client_cores + floorRun.receiver_cores) / floorRun.rate) * 1e6;
}

/** A round on a freshly started process, then one on the same process once warm. */
interface FreshAndWarm {
	fresh: LatencyRound;
	warm: LatencyRound;
}

/**
 * Two rounds on one start: the second begins once every delivery of the first has arrived, so
 * it meets warm code, open connections and an empty queue, as a deployment does most of its life.
 */
async function freshAndWarm(round: () => Promise<LatencyRound>): Promise<FreshAndWarm> {
	const fresh = await round();
	return { fresh, warm: await round() };
}

/** The bare relay, started now, under the same open-loop load. */
function relayLatency(targets: Array<{ url: string }>, ca: string, receivers: Receivers, eventsPerSecond: number): Promise<FreshAndWarm> {
	return withRelay(targets, ca, (send, relay) => freshAndWarm(() => latencyRound(send, orderEvent, [relay], receivers, eventsPerSecond, targets.length)));
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
		await probeAll(processesOf(deployment, receivers));
		rate = await throughput(deployment, receivers, EVENTS);
		loop = await probeAll(processesOf(deployment, receivers));
	} finally {
		await deployment.stop();
	}
	const eventsPerSecond = (OFFERED ?? rate / 2) / HEALTHY;
	const relayRounds: FreshAndWarm[] = [];
	const dispatcherRounds: FreshAndWarm[] = [];
	for (let turn = 0; turn < LATENCY_ROUNDS; turn++) {
		relayRounds.push(await relayLatency(healthyUrls.map(url => ({ url })), ca, receivers, eventsPerSecond));
		deployment = await deploy({ ...options, healthyUrls, caFile });
		const { send, dispatchers } = deployment;
		try {
			dispatcherRounds.push(await freshAndWarm(() => latencyRound(send, orderEvent, dispatchers, receivers, eventsPerSecond, HEALTHY)));
		} finally {
			await deployment.stop();
		}
	}
	const relay = pooled(relayRounds.map(r => r.fresh));
	const dispatcher = pooled(dispatcherRounds.map(r => r.fresh));
	const relayWarm = pooled(relayRounds.map(r => r.warm));
	const dispatcherWarm = pooled(dispatcherRounds.map(r => r.warm));
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
			// The same load again on each started deployment and relay once the first round has
			// drained: the steady state of a running service, apart from a fresh one's start-up queue.
			warm: {
				relay: relayWarm,
				dispatcher: dispatcherWarm,
				p99_vs_relay_steady: ratioOf(dispatcherWarm.steady.p99_ms, relayWarm.steady.p99_ms),
			},
			// CPU time per delivery in steady state (all threads of the dispatcher processes; in the
			// cluster not the gateway, PostgreSQL or NATS): steadier from run to run than the p99.
			cpu_us_per_delivery_steady: cpuPerDelivery(dispatcher.steady.event_loop, relay.steady.event_loop, eventsPerSecond * HEALTHY),
		},
	};
}

function machineOf(loadBefore: number[]) {
	return { cpus: os.cpus().length, model: os.cpus()[0]?.model, node: process.version, loadavg_before: loadBefore.map(v => round(v)), loadavg_after: os.loadavg().map(v => round(v)) };
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
	const floorTargets = healthyUrls.map(url => ({ url, key: secretKeyOf(generateWebhookSecret()) }));
	const loadBefore = os.loadavg();
	const results: Record<string, unknown> = {};
	const stopWatchingSignals = removeLeftoversOnSignal();
	try {
		const floorBeforeRun = NEEDS_FLOOR ? await floor(floorTargets, cert, receivers) : undefined;
		const persistenceFloors: PersistenceFloor[] = [];
		const measurePersistenceFloor = async () => {
			if (NEEDS_PERSISTENCE_FLOOR) persistenceFloors.push(await persistenceFloor(DATABASE_URL, runSchemaName(`floor${crypto.randomBytes(4).toString("hex")}`), PERSISTENCE_FLOOR_DELIVERIES));
		};
		await measurePersistenceFloor();
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
				results.neighbours_sqlite = await neighboursScenario(neighbourLayouts(urls.slice(0, 8), urls[HEALTHY], urls[HEALTHY + 1]), caFile, receivers);
			} else if (scenario === "tracing") {
				results.tracing_sqlite = await tracingScenario(healthyUrls, caFile, receivers);
			} else if (scenario === "backlog") {
				const harness: BacklogHarness = {
					receivers,
					deploy: options => deploy({ ...options, caFile }),
					closedLoop: (deployment, events) => throughput(deployment, receivers, events),
					orderEvent: () => orderEvent(),
					probe: probeAll,
					rawLoop: async () => rawLoopUsOf(await floor(floorTargets, cert, receivers)),
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
		await measurePersistenceFloor();
		// The ratios use the mean of the floor before and after: the machine's other load drifts.
		const floorRate = (floorBeforeRun.rate + floorAfterRun.rate) / 2;
		for (const { figures } of pending) {
			figures.throughput_ratio = ratioOf(figures.deliveries_per_s, floorRate);
			figures.throughput_vs_relay = ratioOf(figures.deliveries_per_s, relayRate);
		}
		if (results.backlog) {
			// The raw loop's CPU per delivery: the floor's client and receivers, before and after.
			const rawLoopsUs = [floorBeforeRun, floorAfterRun].map(rawLoopUsOf);
			// The lesser of the two, unlike the floor's mean: a floor is what the writes cost at least,
			// and the readings of one run differed by up to a third (48 and 62 µs on 2026-11-28).
			const persistenceUs = persistenceFloors.length > 0 ? Math.min(...persistenceFloors.map(f => f.cpu_us_per_delivery.total)) : undefined;
			results.backlog = againstFloor(results.backlog as Awaited<ReturnType<typeof backlogScenario>>, floorRate, rawLoopsUs, persistenceUs);
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
			// What keeping deliveries in PostgreSQL costs at least (persistence-floor.ts), before and after.
			...(persistenceFloors.length > 0 ? { persistence_floor: persistenceFloors } : {}),
			// The same throughput loop through the bare relay (no database): a reference, not the floor.
			relay_throughput: { deliveries_per_s: round(relayRate), ratio_to_floor: ratioOf(relayRate, floorRate) },
			...results,
		};
	} finally {
		await stopWatchingSignals();
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
