// The latency rounds of the delivery benchmark (bench/delivery.ts): an open loop of events, each
// carrying its send time, for START_SECONDS (a freshly started node's first seconds) and then
// STEADY_SECONDS of steady state; the receivers time each arrival. A round also probes the nodes'
// event loops and CPU at the cut and at the end, and counts the machine's busy cores and the TLS
// connections the receivers accepted in each phase. Rounds are pooled, with each round's own
// figures kept beside the pooled ones: what the slow rounds share is what pooling averages away.
import fs from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import type { ChildServer } from "./child";
import { probeAll, type Probe } from "./cluster-nodes";
import { monotonicMs } from "./receiver";
import type { Receivers } from "./receivers";
import { machineCoresBetween, mean, percentile, readMachine, round } from "./stats";

const START_SECONDS = 3;
const STEADY_SECONDS = Number(process.env.BENCH_STEADY_SECONDS ?? 6);
const SAMPLES_FILE = process.env.BENCH_SAMPLES_FILE;

interface LatencyFigures {
	samples: number;
	p50_ms: number;
	p99_ms: number;
	max_ms: number;
}

function latencyOf(values: number[]): LatencyFigures {
	const sorted = [...values].sort((a, b) => a - b);
	return { samples: sorted.length, p50_ms: round(percentile(sorted, 50)), p99_ms: round(percentile(sorted, 99)), max_ms: round(sorted[sorted.length - 1] ?? NaN) };
}

/** The rounds pooled, and what each round showed on its own. */
export interface PooledRounds {
	start: LatencyFigures & { event_loop: Probe[]; machine_cores: number };
	steady: LatencyFigures & { event_loop: Probe[]; machine_cores: number };
	lost: number;
	rounds_p99_ms: { start: number[]; steady: number[] };
	rounds_connections: { start: number[]; steady: number[] };
	rounds_steady_sender_utilization: Array<number | null>;
	rounds_steady_service_cores: number[];
	rounds_steady_claims: Array<{ due: number; of_webhook: number }>;
}

/** One round's latencies (ms) and event-loop probes, before pooling. */
export interface LatencyRound {
	start: number[];
	steady: number[];
	startLoop: Probe[];
	steadyLoop: Probe[];
	/** The whole machine's busy cores in each phase (every process: the producer, NATS, the database, the receivers too). */
	startMachineCores: number;
	steadyMachineCores: number;
	/** TLS connections the receivers accepted in each phase: a handshake each for the sender. */
	startConnections: number;
	steadyConnections: number;
	lost: number;
}

const meanOf = (values: number[]) => round(mean(values));

/** Each process's probe figures, averaged over the rounds (the processes are in the same order). */
function meanProbes(rounds: Probe[][]): Probe[] {
	return rounds[0].map((_, node) => {
		const meanOfField = (field: keyof Probe) => meanOf(rounds.map(probes => probes[node][field] ?? 0));
		const sender = rounds[0][node].sender_utilization === undefined ? {} : { sender_delay_p99_ms: meanOfField("sender_delay_p99_ms"), sender_utilization: meanOfField("sender_utilization") };
		return { delay_p50_ms: meanOfField("delay_p50_ms"), delay_p99_ms: meanOfField("delay_p99_ms"), delay_max_ms: meanOfField("delay_max_ms"), cpu_cores: meanOfField("cpu_cores"), ...sender };
	});
}

/** The rounds' samples pooled, with each round's own p99 beside them. */
export function pooled(rounds: LatencyRound[]): PooledRounds {
	const p99Of = (values: number[]) => latencyOf(values).p99_ms;
	return {
		start: { ...latencyOf(rounds.flatMap(r => r.start)), event_loop: meanProbes(rounds.map(r => r.startLoop)), machine_cores: meanOf(rounds.map(r => r.startMachineCores)) },
		steady: { ...latencyOf(rounds.flatMap(r => r.steady)), event_loop: meanProbes(rounds.map(r => r.steadyLoop)), machine_cores: meanOf(rounds.map(r => r.steadyMachineCores)) },
		lost: rounds.reduce((sum, r) => sum + r.lost, 0),
		rounds_p99_ms: { start: rounds.map(r => p99Of(r.start)), steady: rounds.map(r => p99Of(r.steady)) },
		rounds_connections: { start: rounds.map(r => r.startConnections), steady: rounds.map(r => r.steadyConnections) },
		// Per round, the mean over the processes with sender threads (null for the relay, which has none).
		rounds_steady_sender_utilization: rounds.map(r => {
			const senders = r.steadyLoop.filter(probe => probe.sender_utilization !== undefined);
			return senders.length ? meanOf(senders.map(probe => probe.sender_utilization ?? 0)) : null;
		}),
		// Per round, the service processes' cores in steady state, and their claims there (the
		// dispatchers' totals since start, less those at the cut): how much went by the claim path.
		rounds_steady_service_cores: rounds.map(r => round(r.steadyLoop.reduce((sum, probe) => sum + probe.cpu_cores, 0))),
		rounds_steady_claims: rounds.map(r => {
			const since = (field: "claims_due" | "claims_of_webhook") => r.steadyLoop.reduce((sum, probe, node) => sum + (probe[field] ?? 0) - (r.startLoop[node][field] ?? 0), 0);
			return { due: since("claims_due"), of_webhook: since("claims_of_webhook") };
		}),
	};
}

/**
 * Open loop: `eventsPerSecond` events, each carrying sent_at, for START_SECONDS + STEADY_SECONDS,
 * starting now. Splits the latencies at START_SECONDS, and probes the nodes' event loops there.
 */
export async function latencyRound(
	send: (event: object) => Promise<void>,
	event: (details: Record<string, unknown>) => object,
	nodes: Array<ChildServer<unknown>>,
	receivers: Receivers,
	eventsPerSecond: number,
	healthy: number,
): Promise<LatencyRound> {
	await receivers.samples(); // drops whatever arrived before
	await probeAll(nodes); // resets the event-loop histograms
	const machineAtStart = readMachine();
	let machineAtCut = machineAtStart;
	const connectionsAtStart = receivers.connections;
	let connectionsAtCut = connectionsAtStart;
	const baseOk = receivers.ok;
	const started = monotonicMs();
	const total = Math.round(eventsPerSecond * (START_SECONDS + STEADY_SECONDS));
	let sent = 0;
	let failed = 0;
	let startProbe: Promise<Probe[]> | undefined;
	while (sent < total) {
		const elapsed = monotonicMs() - started;
		if (!startProbe && elapsed >= START_SECONDS * 1000) {
			startProbe = probeAll(nodes);
			machineAtCut = readMachine();
			connectionsAtCut = receivers.connections;
		}
		const due = Math.min(total, Math.floor((elapsed / 1000) * eventsPerSecond));
		for (; sent < due; sent++) send(event({ sent_at: monotonicMs(), sent_wall: Date.now() })).catch(() => (failed += 1));
		await sleep(2);
	}
	const startLoop = await (startProbe ?? probeAll(nodes));
	const expected = baseOk + sent * healthy;
	// Bounded by the wait's own timer, cleared once reached: a bare sleep racing it kept `npm run bench` alive for that minute.
	await receivers.waitForOk(expected, 60_000).catch(() => undefined);
	const steadyLoop = await probeAll(nodes);
	const machineAtEnd = readMachine();
	const samples = await receivers.samples();
	const cut = started + START_SECONDS * 1000;
	// One line per round, relay and dispatcher in turn: when the slow samples came, to line them up with a node's own log.
	if (SAMPLES_FILE) fs.appendFileSync(SAMPLES_FILE, `${JSON.stringify({ started, cut, wall_minus_monotonic_ms: Date.now() - monotonicMs(), samples })}\n`);
	return {
		start: samples.filter(([sentAt]) => sentAt < cut).map(([, ms]) => ms),
		steady: samples.filter(([sentAt]) => sentAt >= cut).map(([, ms]) => ms),
		startLoop,
		steadyLoop,
		startMachineCores: machineCoresBetween(machineAtStart, machineAtCut),
		steadyMachineCores: machineCoresBetween(machineAtCut, machineAtEnd),
		startConnections: connectionsAtCut - connectionsAtStart,
		steadyConnections: receivers.connections - connectionsAtCut,
		lost: Math.max(0, expected - receivers.ok) + failed * healthy,
	};
}
