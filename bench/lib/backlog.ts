// The backlog scenario of the delivery benchmark (BENCH_SCENARIOS=backlog): what real backlogs
// meet, where the closed loop never goes. A receiver back after an outage, a batch of orders that
// change status at once, a dispatcher restarted in a busy hour: many deliveries at once, more
// than intake can lease straight to the worker, so most go through the database and the claims.
//
// Per mode (SQLite one node, PostgreSQL one node, the cluster: a gateway node, a notifier and two
// dispatcher processes on PostgreSQL and JetStream) and per layout (each webhook on its own
// origin, or all ten on one host, as behind one API gateway), on one deployment that stays up
// (and, not by default, postgresql_tls and cluster_tls: the same on a PostgreSQL and a NATS of
// their own that take TLS only):
//   1. a burst of SMALL deliveries on the freshly started node (its first work: cold code, new
//      connections),
//   2. WARM_BURSTS more of SMALL (their median is the warm rate), then one after each idle spell
//      of BENCH_BACKLOG_IDLE_SECONDS, if any,
//   3. the closed loop of the throughput scenario, for the open-loop-against-closed-loop ratio,
//   4. LARGE_RUNS bursts of LARGE, each against the warm median.
// A burst is open loop: every event is sent at once (SENDERS producer calls in flight), and it
// counts until the receivers have answered 200 to every delivery (distinct message ids). A burst
// that loses anything within its bound is marked invalid and gets no rate.
// On the one-node modes (own origins) the deployment then gets deliveries pending for a later
// retry, inserted straight into its table, in steps (PENDING_STEPS), and WARM_BURSTS bursts of
// SMALL at each step, after one that opens the connections the idle spell closed: their rate
// against the empty table's. Then DUE_ROUNDS rounds of DUE_ROWS deliveries laid in the table due
// now, which only the poll's claim of due rows takes (intake and refills never see them): the
// mean of those claims (the dispatchers'
// webhook_delivery_claim_seconds) against the first step's. The bursts' own claims are reported
// too, but a burst of SMALL is over within one or two polls: three samples per step were too few.
//
// CPU per delivery during each burst: the service's processes (all their threads), PostgreSQL
// (every postgres process) and nats-server, read from /proc, beside the receivers' (apart).
import crypto from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { Knex } from "knex";
import { orderStatusMessage } from "../../lib/schemas/deliveries";
import { TASKING_ORDER_STATUS_TOPIC, type TaskingOrderStatusEvent } from "../../lib/schemas/events";
import { connect, type NatsConnection } from "nats";
import { natsServerOptions } from "../../lib/connection-urls";
import type { ChildServer } from "./child";
import type { ProbeFigures, ProbeWindow } from "./event-loop-probe";
import { databaseCounters, databaseWorkBetween, type DatabaseWork } from "./database-work";
import { BROKER_PROCESSES, DATABASE_PROCESSES, cpuSecondsBetween, cpuSecondsByPid } from "./process-cpu";
import { monotonicMs } from "./receiver";
import type { Receivers } from "./receivers";
import { mean, percentile, ratioOrNull, round } from "./stats";
import type { NatsEnv } from "../../test/helpers/nats-server";

const SMALL = Number(process.env.BENCH_BACKLOG_SMALL ?? 5_000);
const LARGE = Number(process.env.BENCH_BACKLOG_LARGE ?? 100_000);
const LARGE_RUNS = Number(process.env.BENCH_BACKLOG_RUNS ?? 1);
const WARM_BURSTS = 3;
const SENDERS = 256;
export const MODES = (process.env.BENCH_BACKLOG_MODES ?? "sqlite,postgresql,cluster").split(",");
const LAYOUTS = (process.env.BENCH_BACKLOG_LAYOUTS ?? "own_origins,one_host").split(",");
const PENDING_STEPS = (process.env.BENCH_BACKLOG_PENDING ?? "1000,1000000,10000000").split(",").filter(Boolean).map(Number);
// Idle spells (seconds, comma-separated; none by default) after the warm bursts, each followed by a
// burst of SMALL: warm code meeting whatever an idle spell undoes. The receivers and the sender
// close a connection idle for 30 s, so "20,35" tells a spell that keeps them from one that does not.
const IDLE_SECONDS = (process.env.BENCH_BACKLOG_IDLE_SECONDS ?? "").split(",").filter(Boolean).map(Number);
// SQLite lays pending rows down on the service's own single writer, a million in about three
// minutes here: steps above this are left out there (and said so in the JSON).
const SQLITE_PENDING_MAX = Number(process.env.BENCH_BACKLOG_SQLITE_PENDING_MAX ?? 1_000_000);
// Rows per insert statement while the pending deliveries are laid down.
const PENDING_CHUNK = 50_000;
// At each pending step: rounds of deliveries due now, laid straight into the table, one poll apart.
const DUE_ROUNDS = Number(process.env.BENCH_BACKLOG_DUE_ROUNDS ?? 20);
const DUE_ROWS = 500;
export const BACKLOG_GOALS = { large_vs_warm: 0.9, cold_vs_warm: 0.8, open_vs_closed: 0.9, vs_floor: 0.5, pending_vs_empty: 0.9, claim_with_most_pending_vs_fewest: 2, cpu_vs_raw_loop: 1.5 };

type Probe = Omit<ProbeFigures, "type">;

/** Open loop: every event sent at once, SENDERS producer calls in flight. Returns how many sends failed. */
export async function sendAllAtOnce(events: object[], send: (event: object) => Promise<void>): Promise<number> {
	let next = 0;
	let failed = 0;
	const sender = async () => {
		while (next < events.length) await send(events[next++]).catch(() => (failed += 1));
	};
	await Promise.all(Array.from({ length: SENDERS }, sender));
	return failed;
}

/** A service process of a deployment: "all" on one node; in the cluster a gateway, a notifier and two "dispatchers". */
export interface ServiceNode {
	role: "gateway" | "notifier" | "dispatchers" | "all";
	server: ChildServer<unknown>;
}

/** The service's processes, then the receivers': what a burst probes for CPU. */
export const processesOf = (deployment: BacklogDeployment, receivers: Receivers) => [...deployment.nodes.map(node => node.server), receivers.child];

/** What the backlog scenario needs of the delivery benchmark's own machinery. */
export interface BacklogDeployment {
	engine: "sqlite" | "postgresql";
	cluster: boolean;
	/** The NATS server its processes joined. */
	nats: NatsEnv;
	/** The dispatcher processes (one, or two in the cluster). */
	dispatchers: Array<ChildServer<unknown>>;
	/** Every service process and its role, by which a burst splits the service's CPU. */
	nodes: ServiceNode[];
	db: Knex;
	healthyIds: string[];
	/** Each process's start by name, from spawning it to its report that it is up. */
	startSeconds: Record<string, number>;
	send(event: object): Promise<void>;
	stop(): Promise<void>;
}

export interface BacklogHarness {
	receivers: Receivers;
	/** `tls`: on a NATS (the cluster) and a PostgreSQL of the deployment's own that take TLS only. */
	deploy(options: { engine: "sqlite" | "postgresql"; cluster?: boolean; healthyUrls: string[]; tls?: boolean }): Promise<BacklogDeployment>;
	/** The closed-loop throughput (deliveries/s) of `events` events on a running deployment. */
	closedLoop(deployment: BacklogDeployment, events: number): Promise<number>;
	orderEvent(): object;
	probe(nodes: Array<ChildServer<unknown>>, next?: ProbeWindow): Promise<Probe[]>;
	/** The raw loop's CPU µs per delivery (the floor's client and receivers), measured now. */
	rawLoop(): Promise<number>;
}

interface CpuPerDelivery {
	service: number;
	database: number;
	nats: number;
	/** Service, database and NATS: what the goal counts. */
	total: number;
	receivers: number;
	/** The service's share by role (the two dispatchers of the cluster together). */
	service_by_role: Record<string, number>;
}

interface BurstFigures {
	deliveries: number;
	received: number;
	lost: number;
	repeats: number;
	valid: boolean;
	/** The webhook request as the receiver read it: request line, headers and body, without TLS. */
	http_request_bytes_per_delivery: number | null;
	/** TLS connections the receivers accepted during the burst: each cost both sides a handshake. */
	connections_opened: number;
	seconds: number;
	/** Until the producer's last send was acknowledged (the channel, or the database embedded). */
	intake_seconds: number;
	deliveries_per_s: number | null;
	cpu_us_per_delivery: CpuPerDelivery;
	/** The dispatchers' claims of due rows during the burst: how many, and their mean. */
	claims_due: number;
	claim_due_mean_ms: number | null;
	/** PostgreSQL's work per delivery (the whole server: nothing else should run meanwhile). */
	postgresql_per_delivery?: DatabaseWork;
	/** Messages and bytes on NATS per delivery (every subject but the server's own), in the cluster. */
	nats_per_delivery?: { messages: number; bytes: number };
}

/** Counts what crosses NATS while it runs: a subscriber to every subject. */
async function natsTraffic(server: NatsEnv): Promise<{ read(): { messages: number; bytes: number }; close(): Promise<void> }> {
	const nats: NatsConnection = await connect(natsServerOptions(server.TRANSPORTER, server));
	let messages = 0;
	let bytes = 0;
	const subscription = nats.subscribe(">", {
		callback: (_err, message) => {
			messages += 1;
			bytes += message.data.length + message.subject.length + (message.headers ? message.headers.toString().length : 0);
		},
	});
	return {
		read: () => ({ messages, bytes }),
		async close() {
			subscription.unsubscribe();
			await nats.close();
		},
	};
}

const median = (values: number[]) => percentile([...values].sort((a, b) => a - b), 50);
const rateOf = (bursts: BurstFigures[]) => (bursts.every(burst => burst.valid) ? median(bursts.map(burst => burst.deliveries_per_s!)) : null);

type ClaimTotals = { count: number; seconds: number };

function claimTotals(probes: Probe[]): ClaimTotals {
	return probes.reduce((sum, probe) => ({ count: sum.count + (probe.claims_due ?? 0), seconds: sum.seconds + (probe.claims_due_seconds ?? 0) }), { count: 0, seconds: 0 });
}

/** The claims of due rows made between two readings, and their mean. */
function claimsBetween(before: ClaimTotals, after: ClaimTotals): { claims_due: number; claim_due_mean_ms: number | null } {
	const claims = after.count - before.count;
	return { claims_due: claims, claim_due_mean_ms: claims > 0 ? round(((after.seconds - before.seconds) / claims) * 1000, 3) : null };
}

async function burst(harness: BacklogHarness, deployment: BacklogDeployment, deliveries: number, options: { countNats?: boolean } = {}): Promise<BurstFigures> {
	const { receivers } = harness;
	const webhooks = deployment.healthyIds.length;
	const events = Array.from({ length: Math.ceil(deliveries / webhooks) }, () => harness.orderEvent());
	const expected = events.length * webhooks;
	const baseOk = receivers.ok;
	const baseRepeats = receivers.repeats;
	const baseBytes = receivers.okBytes;
	const baseConnections = receivers.connections;
	const claimsBefore = claimTotals(await harness.probe(deployment.dispatchers));
	await harness.probe(processesOf(deployment, receivers), "cpu"); // starts every process's CPU window, without the delay monitor
	const counters = deployment.engine === "postgresql" ? await databaseCounters(deployment.db) : undefined;
	// Apart: the counting subscriber doubles what nats-server sends, so its CPU would not be the service's.
	const traffic = options.countNats ? await natsTraffic(deployment.nats) : undefined;
	const database = cpuSecondsByPid(DATABASE_PROCESSES);
	const nats = cpuSecondsByPid(BROKER_PROCESSES);
	const started = monotonicMs();
	const failedSends = await sendAllAtOnce(events, event => deployment.send(event));
	const intakeSeconds = (monotonicMs() - started) / 1000;
	// A minute, plus 10 ms per delivery.
	const drained = await receivers.drainedWithin(baseOk + expected, 60_000 + 10 * expected);
	const seconds = (monotonicMs() - started) / 1000;
	const probes = await harness.probe(processesOf(deployment, receivers));
	const databaseSeconds = cpuSecondsBetween(database, cpuSecondsByPid(DATABASE_PROCESSES));
	const natsSeconds = cpuSecondsBetween(nats, cpuSecondsByPid(BROKER_PROCESSES));
	const claimsAfter = claimTotals(await harness.probe(deployment.dispatchers));
	const onNats = traffic?.read();
	await traffic?.close();
	const received = receivers.ok - baseOk;
	const valid = drained && failedSends === 0 && received === expected;
	const perDelivery = (cpuSeconds: number) => round((cpuSeconds / expected) * 1e6);
	const serviceByRole: Record<string, number> = {};
	for (const [i, { role }] of deployment.nodes.entries()) serviceByRole[role] = (serviceByRole[role] ?? 0) + probes[i].cpu_cores * seconds;
	const serviceSeconds = Object.values(serviceByRole).reduce((sum, used) => sum + used, 0);
	const receiverSeconds = probes[deployment.nodes.length].cpu_cores * seconds;
	process.stderr.write(`bench delivery: burst of ${expected}: ${valid ? `${Math.round(expected / seconds)}/s` : `INVALID, ${expected - received} missing`} in ${seconds.toFixed(1)} s\n`);
	return {
		deliveries: expected,
		received,
		lost: expected - received,
		repeats: receivers.repeats - baseRepeats,
		valid,
		http_request_bytes_per_delivery: received > 0 ? round((receivers.okBytes - baseBytes) / received) : null,
		connections_opened: receivers.connections - baseConnections,
		seconds: round(seconds),
		intake_seconds: round(intakeSeconds),
		deliveries_per_s: valid ? round(expected / seconds) : null,
		cpu_us_per_delivery: {
			service: perDelivery(serviceSeconds),
			database: perDelivery(databaseSeconds),
			nats: perDelivery(natsSeconds),
			total: perDelivery(serviceSeconds + databaseSeconds + natsSeconds),
			receivers: perDelivery(receiverSeconds),
			service_by_role: Object.fromEntries(Object.entries(serviceByRole).map(([role, used]) => [role, perDelivery(used)])),
		},
		...claimsBetween(claimsBefore, claimsAfter),
		...(counters ? { postgresql_per_delivery: await databaseWorkBetween(deployment.db, counters, expected) } : {}),
		...(onNats ? { nats_per_delivery: { messages: round(onNats.messages / expected, 2), bytes: round(onNats.bytes / expected) } } : {}),
	};
}

/**
 * Adds deliveries pending for a retry a week from now (never due during the run) until the table
 * holds `total` of them; each has a webhook id of its own, none of which exists.
 */
async function addPending(db: Knex, engine: "sqlite" | "postgresql", already: number, total: number): Promise<void> {
	const now = new Date().toISOString();
	const later = new Date(Date.now() + 7 * 24 * 3_600_000).toISOString();
	const eventId = crypto.randomUUID();
	await db("delivery_messages").insert({ event_id: eventId, customer_id: "bench-pending", user_id: "bench-pending", type: TASKING_ORDER_STATUS_TOPIC, body: "{}", occurred_at: now, created_at: now });
	for (let done = already; done < total; done += PENDING_CHUNK) {
		const rows = Math.min(PENDING_CHUNK, total - done);
		const columns = "id, event_id, webhook_id, customer_id, status, attempt_count, next_attempt_at, created_at, updated_at";
		if (engine === "postgresql") {
			await db.raw(`INSERT INTO deliveries (${columns}) SELECT gen_random_uuid(), ?, gen_random_uuid(), 'bench-pending', 'pending', 1, ?, ?, ? FROM generate_series(1, ?)`, [eventId, later, now, now, rows]);
		} else {
			await db.raw(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) INSERT INTO deliveries (${columns}) SELECT lower(hex(randomblob(16))), ?, lower(hex(randomblob(16))), 'bench-pending', 'pending', 1, ?, ?, ? FROM n`, [rows, eventId, later, now, now]);
		}
	}
	// Real pending rows pile up over hours, not in one statement: the vacuum, statistics and
	// checkpoint that a bulk insert leaves due are done here, not during the bursts measured next
	// (unsettled, the first burst after a million rows ran at half the rate of the next two).
	if (engine === "postgresql") {
		await db.raw("VACUUM ANALYZE deliveries");
		await db.raw("CHECKPOINT");
	}
}

interface DueRounds {
	rounds: number;
	deliveries: number;
	lost: number;
	valid: boolean;
	/** The dispatchers' claims of due rows meanwhile (those that found none included), and their mean. */
	claims_due: number;
	claim_due_mean_ms: number | null;
}

/**
 * DUE_ROUNDS rounds of DUE_ROWS deliveries (messages of their own, spread over the healthy
 * webhooks, no order key) inserted due now, each round once the previous one was answered: what
 * the claim of due rows meets when retries come due, with the table as it stands.
 */
async function dueRounds(harness: BacklogHarness, deployment: BacklogDeployment): Promise<DueRounds> {
	const { receivers } = harness;
	const webhooks = deployment.healthyIds;
	const eventsPerRound = Math.ceil(DUE_ROWS / webhooks.length);
	const claimsBefore = claimTotals(await harness.probe(deployment.dispatchers));
	const baseOk = receivers.ok;
	let expected = 0;
	let drained = true;
	for (let round = 0; round < DUE_ROUNDS && drained; round++) {
		const now = new Date().toISOString();
		const events = Array.from({ length: eventsPerRound }, () => ({ id: crypto.randomUUID(), event: harness.orderEvent() as TaskingOrderStatusEvent & { customer_id: string } }));
		await deployment.db.transaction(async trx => {
			// The message as intake would have written it.
			await trx("delivery_messages").insert(
				events.map(({ id, event }) => ({
					event_id: id,
					customer_id: event.customer_id,
					user_id: event.user_id,
					type: TASKING_ORDER_STATUS_TOPIC,
					body: orderStatusMessage(event, TASKING_ORDER_STATUS_TOPIC, now),
					occurred_at: now,
					created_at: now,
				})),
			);
			const rows = events.flatMap(({ id, event }) =>
				webhooks.map(webhookId => ({ id: crypto.randomUUID(), event_id: id, webhook_id: webhookId, customer_id: event.customer_id, status: "pending", attempt_count: 0, next_attempt_at: now, created_at: now, updated_at: now })),
			);
			for (let i = 0; i < rows.length; i += 250) await trx("deliveries").insert(rows.slice(i, i + 250));
		});
		expected += eventsPerRound * webhooks.length;
		drained = await receivers.drainedWithin(baseOk + expected, 60_000);
	}
	const claimsAfter = claimTotals(await harness.probe(deployment.dispatchers));
	const received = receivers.ok - baseOk;
	return {
		rounds: DUE_ROUNDS,
		deliveries: expected,
		lost: expected - received,
		valid: drained && received === expected,
		...claimsBetween(claimsBefore, claimsAfter),
	};
}

async function pendingSteps(harness: BacklogHarness, deployment: BacklogDeployment, engine: "sqlite" | "postgresql", emptyRate: number | null) {
	const steps = [];
	let pending = 0;
	const skipped = engine === "sqlite" ? PENDING_STEPS.filter(target => target > SQLITE_PENDING_MAX) : [];
	for (const target of PENDING_STEPS.filter(step => !skipped.includes(step))) {
		const started = monotonicMs();
		await addPending(deployment.db, engine, pending, target);
		pending = target;
		const insertSeconds = round((monotonicMs() - started) / 1000);
		// Laying rows down leaves the service idle that long, and past the receivers' keep-alive
		// (30 s) its connections are closed: the next burst opens them again, as the cold burst
		// did. That burst goes before the measured ones, as the cold one goes before the warm ones,
		// and is reported on its own, so that a step compares table sizes, not idle spells.
		const afterIdle = await burst(harness, deployment, SMALL);
		const bursts = [];
		for (let i = 0; i < WARM_BURSTS; i++) bursts.push(await burst(harness, deployment, SMALL));
		const claims = bursts.reduce((sum, b) => sum + b.claims_due, 0);
		const claimMs = claims > 0 ? bursts.reduce((sum, b) => sum + (b.claim_due_mean_ms ?? 0) * b.claims_due, 0) / claims : null;
		const due = await dueRounds(harness, deployment);
		process.stderr.write(`bench delivery: ${pending} pending: ${due.claims_due} claims of due rows, mean ${due.claim_due_mean_ms} ms${due.valid ? "" : `, INVALID (${due.lost} missing)`}\n`);
		steps.push({
			pending,
			insert_seconds: insertSeconds,
			after_idle_burst: afterIdle,
			after_idle_vs_empty_table: ratioOrNull(afterIdle.deliveries_per_s, emptyRate),
			deliveries_per_s: rateOf(bursts),
			vs_empty_table: ratioOrNull(rateOf(bursts), emptyRate),
			bursts_claim_due_mean_ms: claimMs === null ? null : round(claimMs, 3),
			due_rounds: due,
			claim_due_mean_ms: due.valid ? due.claim_due_mean_ms : null,
			bursts,
		});
	}
	const first = steps[0]?.claim_due_mean_ms ?? null;
	const last = steps[steps.length - 1]?.claim_due_mean_ms ?? null;
	const firstOfBursts = steps[0]?.bursts_claim_due_mean_ms ?? null;
	const lastOfBursts = steps[steps.length - 1]?.bursts_claim_due_mean_ms ?? null;
	return {
		steps,
		claim_with_most_pending_vs_fewest: ratioOrNull(last, first),
		bursts_claim_with_most_pending_vs_fewest: ratioOrNull(lastOfBursts, firstOfBursts),
		...(skipped.length ? { steps_not_run: skipped, why_not_run: `above BENCH_BACKLOG_SQLITE_PENDING_MAX (${SQLITE_PENDING_MAX})` } : {}),
	};
}

// A mode with _tls is its twin without, on servers of the run's own that take TLS only.
const TLS_SUFFIX = "_tls";
const isTls = (mode: string) => mode.endsWith(TLS_SUFFIX);
const plainOf = (mode: string) => (isTls(mode) ? mode.slice(0, -TLS_SUFFIX.length) : mode);
const isCluster = (mode: string) => plainOf(mode) === "cluster";

async function modeRun(harness: BacklogHarness, mode: string, urls: string[], withPending: boolean) {
	const engine = plainOf(mode) === "sqlite" ? "sqlite" : "postgresql";
	const deployment = await harness.deploy({ engine, cluster: isCluster(mode), healthyUrls: urls, tls: isTls(mode) });
	try {
		const cold = await burst(harness, deployment, SMALL);
		const warm = [];
		for (let i = 0; i < WARM_BURSTS; i++) warm.push(await burst(harness, deployment, SMALL));
		const warmRate = rateOf(warm);
		const idleBursts = [];
		for (const idleSeconds of IDLE_SECONDS) {
			await sleep(idleSeconds * 1000);
			const afterIdle = await burst(harness, deployment, SMALL);
			idleBursts.push({ idle_seconds: idleSeconds, burst: afterIdle, vs_warm: ratioOrNull(afterIdle.deliveries_per_s, warmRate) });
		}
		const closed = await harness.closedLoop(deployment, Math.ceil(SMALL * 4 / urls.length));
		// The raw loop again, right before the large bursts: the run's own floor is measured at its
		// start and end, half an hour apart, and this machine's speed drifts by a third within that.
		const rawLoopUs = await harness.rawLoop();
		const large = [];
		for (let i = 0; i < LARGE_RUNS; i++) large.push(await burst(harness, deployment, LARGE));
		const largeRates = large.map(b => b.deliveries_per_s);
		// NATS traffic per delivery, in a burst of its own (the counting subscriber adds its own load).
		const natsCounted = isCluster(mode) ? { nats_counted_burst: await burst(harness, deployment, SMALL, { countNats: true }) } : {};
		return {
			start_seconds: deployment.startSeconds,
			cold_burst: cold,
			warm_bursts: warm,
			warm_deliveries_per_s: warmRate,
			closed_loop_deliveries_per_s: round(closed),
			large_bursts: large,
			cold_vs_warm: ratioOrNull(cold.deliveries_per_s, warmRate),
			...(idleBursts.length ? { after_idle_bursts: idleBursts } : {}),
			large_vs_warm: largeRates.map(rate => ratioOrNull(rate, warmRate)),
			large_vs_closed_loop: largeRates.map(rate => ratioOrNull(rate, closed)),
			raw_loop_just_before_cpu_us_per_delivery: round(rawLoopUs),
			large_cpu_vs_raw_loop_just_before: large.map(b => ratioOrNull(b.cpu_us_per_delivery.total, rawLoopUs)),
			...natsCounted,
			...(withPending ? { pending: await pendingSteps(harness, deployment, engine, warmRate) } : {}),
		};
	} finally {
		await deployment.stop();
	}
}

type ModeFigures = Awaited<ReturnType<typeof modeRun>>;

/** Runs every mode and layout. */
export async function backlogScenario(harness: BacklogHarness, healthyUrls: string[]) {
	const oneHost = healthyUrls.map((_, i) => new URL(`/p${i + 1}`, healthyUrls[0]).toString());
	const results: Record<string, Record<string, ModeFigures>> = {};
	for (const mode of MODES) {
		results[mode] = {};
		for (const layout of LAYOUTS) {
			process.stderr.write(`bench delivery: backlog ${mode} ${layout}\n`);
			const urls = layout === "one_host" ? oneHost : healthyUrls;
			const withPending = !isCluster(mode) && !isTls(mode) && layout === LAYOUTS[0] && PENDING_STEPS.length > 0;
			results[mode][layout] = await modeRun(harness, mode, urls, withPending);
		}
	}
	// Each _tls mode against its twin of the same run, e.g. cluster_tls_vs_cluster.
	const tlsComparisons: Record<string, Record<string, ReturnType<typeof tlsAgainstPlain>>> = {};
	for (const mode of MODES.filter(isTls)) {
		const plain = plainOf(mode);
		if (results[plain]) tlsComparisons[`${mode}_vs_${plain}`] = Object.fromEntries(LAYOUTS.map(layout => [layout, tlsAgainstPlain(results[plain][layout], results[mode][layout])]));
	}
	return { small: SMALL, large: LARGE, large_runs: LARGE_RUNS, warm_bursts: WARM_BURSTS, goals: BACKLOG_GOALS, ...results, ...tlsComparisons };
}

/**
 * What TLS costs, from a mode and its _tls twin in one run: rates ÷ the plain mode's, and CPU per
 * delivery in the large bursts (means), also each ÷ the raw loop measured just before it, since
 * the machine's speed drifts between the two modes.
 */
function tlsAgainstPlain(plain: ModeFigures, tls: ModeFigures) {
	const cpu = (figures: ModeFigures) => {
		const large = figures.large_bursts.filter(b => b.valid);
		const meanOf = (pick: (b: BurstFigures) => number) => (large.length ? mean(large.map(pick)) : null);
		return { total: meanOf(b => b.cpu_us_per_delivery.total), nats: meanOf(b => b.cpu_us_per_delivery.nats), service: meanOf(b => b.cpu_us_per_delivery.service) };
	};
	const [plainCpu, tlsCpu] = [cpu(plain), cpu(tls)];
	const largeRate = (figures: ModeFigures) => (figures.large_bursts.every(b => b.valid) ? mean(figures.large_bursts.map(b => b.deliveries_per_s!)) : null);
	const vsRawLoop = (total: number | null, figures: ModeFigures) => (total === null ? null : total / figures.raw_loop_just_before_cpu_us_per_delivery);
	return {
		warm_rate: ratioOrNull(tls.warm_deliveries_per_s, plain.warm_deliveries_per_s),
		large_rate: ratioOrNull(largeRate(tls), largeRate(plain)),
		large_cpu_us_per_delivery: { plain: plainCpu, tls: tlsCpu },
		large_cpu_total: ratioOrNull(tlsCpu.total, plainCpu.total),
		large_cpu_total_vs_raw_loop_just_before: ratioOrNull(vsRawLoop(tlsCpu.total, tls), vsRawLoop(plainCpu.total, plain)),
	};
}

/**
 * The figures against the same run's floor, once it is measured again at the end: the large
 * bursts' rate ÷ the floor's, and their CPU per delivery (service, database, NATS) ÷ the raw
 * loop's (the floor's client and receivers together). With PostgreSQL's persistence floor
 * (persistence-floor.ts) it also gives PostgreSQL's modes ÷ the raw loop plus that floor: what a
 * service that keeps every delivery in PostgreSQL cannot spend less than.
 */
export function againstFloor(backlog: Awaited<ReturnType<typeof backlogScenario>>, floorRate: number, runRawLoopsUs: number[], persistenceUsPerDelivery?: number) {
	const rawLoopUsPerDelivery = mean(runRawLoopsUs);
	const rawLoopsUs = [...runRawLoopsUs];
	const persistedRawLoopUs = persistenceUsPerDelivery === undefined ? undefined : rawLoopUsPerDelivery + persistenceUsPerDelivery;
	for (const mode of MODES) {
		for (const layout of LAYOUTS) {
			const figures = (backlog as unknown as Record<string, Record<string, ModeFigures & Record<string, unknown>>>)[mode]?.[layout];
			if (!figures) continue;
			rawLoopsUs.push(figures.raw_loop_just_before_cpu_us_per_delivery);
			figures.large_vs_floor = figures.large_bursts.map(b => ratioOrNull(b.deliveries_per_s, floorRate));
			figures.large_cpu_vs_raw_loop = figures.large_bursts.map(b => ratioOrNull(b.cpu_us_per_delivery.total, rawLoopUsPerDelivery));
			// PostgreSQL's persistence floor applies where PostgreSQL keeps the deliveries.
			if (persistedRawLoopUs !== undefined && plainOf(mode) !== "sqlite") {
				figures.large_cpu_vs_persisted_raw_loop = figures.large_bursts.map(b => ratioOrNull(b.cpu_us_per_delivery.total, persistedRawLoopUs));
			}
		}
	}
	return {
		...backlog,
		raw_loop_cpu_us_per_delivery: round(rawLoopUsPerDelivery),
		// Every raw loop of the run (start, end, and before each mode's large bursts): how far the
		// denominator of the CPU goal moved within one run.
		raw_loop_range_cpu_us_per_delivery: [round(Math.min(...rawLoopsUs)), round(Math.max(...rawLoopsUs))],
		...(persistedRawLoopUs === undefined ? {} : { persisted_raw_loop_cpu_us_per_delivery: round(persistedRawLoopUs) }),
	};
}
