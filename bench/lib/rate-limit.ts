// The ratelimit scenario of the delivery benchmark (BENCH_SCENARIOS=ratelimit). Issue 33 asks that
// a rate-limited webhook beside unlimited ones not slow the unlimited ones: at least 0.9 of their
// throughput without it. The limited webhook's deliveries wait for send times while the others'
// go at once; the question is whether their waiting (leases held, rows handed back, reservations
// in the database) costs the rest anything.
//
// Per engine, ROUNDS rounds, each of two fresh one-node deployments taking turns (which goes first
// alternates, so that the machine's drift lands on both):
//   - without: the HEALTHY unlimited webhooks;
//   - with: the same, and one more webhook limited to LIMIT a second, at a receiver process of its
//     own, subscribed to the same events, so it gets as many deliveries as each of the others.
// Each deployment is warmed up by the closed loop with every webhook unlimited; the limit is then
// set by the webhooks service's update action (as PATCH does), and one open-loop burst of EVENTS
// events is sent at once. The unlimited webhooks' rate counts until their receivers have answered
// 200 to every distinct message id; the limited webhook is then waited for too, to the last of its
// deliveries, before the deployment stops. A round that loses anything, or fails a send, is marked
// invalid and gets no rate.
//
// The limited receiver records when each request arrived (events carry a send time, and the
// receiver gives back arrival minus it), so the limit is checked where it matters: the busiest
// one-second window of arrivals (a half-open window starting at a request) and the achieved rate
// from the first arrival to the last, each against the limit.
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { ServiceBroker } from "moleculer";
import { sendAllAtOnce, type BacklogDeployment } from "./backlog";
import { startChild } from "./child";
import { monotonicMs, type ReceiverReady } from "./receiver";
import { Receivers } from "./receivers";
import { busiestSecond, mean, round } from "./stats";

const EVENTS = Number(process.env.BENCH_RATELIMIT_EVENTS ?? 500);
const LIMIT = Number(process.env.BENCH_RATELIMIT_LIMIT ?? 50);
const ROUNDS = Number(process.env.BENCH_RATELIMIT_ROUNDS ?? 3);
const ENGINES = (process.env.BENCH_RATELIMIT_ENGINES ?? "sqlite").split(",").filter(Boolean) as Array<"sqlite" | "postgresql">;
const WARM_UP_EVENTS = 200;
export const RATE_LIMIT_GOALS = { unlimited_with_vs_without: 0.9, limited_busiest_second_vs_limit_at_most: 1.1 };

export interface RateLimitDeployment extends BacklogDeployment {
	producer: ServiceBroker;
}

/** What the scenario needs of the delivery benchmark's own machinery. */
export interface RateLimitHarness {
	/** The unlimited webhooks' receivers. */
	receivers: Receivers;
	/** RECEIVER_KEY and RECEIVER_CERT of those receivers, for the limited webhook's own (the same CA). */
	receiverEnv: Record<string, string>;
	deploy(options: { engine: "sqlite" | "postgresql"; healthyUrls: string[]; neighbourUrls: string[] }): Promise<RateLimitDeployment>;
	/** The closed-loop throughput (deliveries/s) of `events` events on a running deployment. */
	closedLoop(deployment: RateLimitDeployment, events: number): Promise<number>;
	orderEvent(extra: Record<string, unknown>): object;
}

export interface LimitedFigures {
	deliveries: number;
	received: number;
	lost: number;
	repeats: number;
	/** From the burst's start to the last delivery answered. */
	seconds: number;
	/** From the first arrival to the last, plus one spacing: the time its sends took. */
	span_seconds: number;
	achieved_per_s: number;
	achieved_vs_limit: number;
	busiest_second: number;
	busiest_second_vs_limit: number;
	/** Rows attempted more than once or not succeeded: waiting for a send time must never be an attempt. */
	rows_not_succeeded_first_time: number;
}

/** One burst's figures, as the JSON prints them. */
export interface BurstFigures {
	unlimited_deliveries: number;
	received: number;
	lost: number;
	repeats: number;
	failed_sends: number;
	valid: boolean;
	intake_seconds: number;
	seconds: number;
	unlimited_deliveries_per_s: number | null;
	limited?: LimitedFigures;
}

/** Sets the limit as PATCH /webhooks/{id} does, on the webhook at `url`. */
async function limitWebhook(deployment: RateLimitDeployment, url: string, limit: number): Promise<string> {
	const row: { id: string; customer_id: string } | undefined = await deployment.db("webhooks").where({ url }).first("id", "customer_id");
	if (!row) throw new Error(`no webhook at ${url}`);
	const updated = await deployment.producer.call<{ rate_limit: number | null }, object>("webhooks.update", { id: row.id, rate_limit: limit }, { meta: { customerId: row.customer_id } });
	if (updated.rate_limit !== limit) throw new Error(`the webhook's rate_limit is ${updated.rate_limit}, not ${limit}`);
	return row.id;
}

/** Waits (bounded) until every row of the webhook is written, and counts those not succeeded at the first attempt. */
async function rowsNotSucceededFirstTime(deployment: RateLimitDeployment, webhookId: string, deliveries: number): Promise<number> {
	const deadline = monotonicMs() + 30_000;
	for (;;) {
		const rows: Array<{ status: string; attempt_count: number }> = await deployment.db("deliveries").where({ webhook_id: webhookId }).select("status", "attempt_count");
		const bad = rows.filter(row => row.status !== "succeeded" || Number(row.attempt_count) !== 1).length;
		if ((rows.length >= deliveries && bad === 0) || monotonicMs() > deadline) return bad + Math.max(0, deliveries - rows.length);
		await sleep(50);
	}
}

async function burst(harness: RateLimitHarness, deployment: RateLimitDeployment, limited?: { receivers: Receivers; webhookId: string }): Promise<BurstFigures> {
	const { receivers } = harness;
	const webhooks = deployment.healthyIds.length;
	// Every event carries a send time, with the limited webhook or without, so both bursts cost the receivers the same.
	const events = Array.from({ length: EVENTS }, () => harness.orderEvent({ sent_at: monotonicMs() }));
	const expected = EVENTS * webhooks;
	const baseOk = receivers.ok;
	const baseRepeats = receivers.repeats;
	const limitedBase = limited ? { ok: limited.receivers.ok, repeats: limited.receivers.repeats } : undefined;
	await limited?.receivers.samples(); // drops the warm-up's arrivals
	const started = monotonicMs();
	const failedSends = await sendAllAtOnce(events, event => deployment.send(event));
	const intakeSeconds = (monotonicMs() - started) / 1000;
	// The bounds only turn a stall into an invalid round: a minute, plus 10 ms per delivery.
	const drained = await receivers.drainedWithin(baseOk + expected, 60_000 + 10 * expected);
	const seconds = (monotonicMs() - started) / 1000;
	const received = receivers.ok - baseOk;
	await receivers.samples(); // the unlimited arrivals' samples are not needed: let the receivers drop them
	let limitedFigures: LimitedFigures | undefined;
	if (limited && limitedBase) {
		await limited.receivers.drainedWithin(limitedBase.ok + EVENTS, 60_000 + (2_000 * EVENTS) / LIMIT);
		const limitedSeconds = (monotonicMs() - started) / 1000;
		const arrivals = (await limited.receivers.samples()).map(([sentAt, ms]) => sentAt + ms);
		const limitedReceived = limited.receivers.ok - limitedBase.ok;
		const span = arrivals.length > 0 ? (Math.max(...arrivals) - Math.min(...arrivals) + 1_000 / LIMIT) / 1_000 : Number.NaN;
		const busiest = busiestSecond(arrivals);
		limitedFigures = {
			deliveries: EVENTS,
			received: limitedReceived,
			lost: EVENTS - limitedReceived,
			repeats: limited.receivers.repeats - limitedBase.repeats,
			seconds: round(limitedSeconds),
			span_seconds: round(span),
			achieved_per_s: round(limitedReceived / span),
			achieved_vs_limit: round(limitedReceived / span / LIMIT),
			busiest_second: busiest,
			busiest_second_vs_limit: round(busiest / LIMIT),
			rows_not_succeeded_first_time: await rowsNotSucceededFirstTime(deployment, limited.webhookId, EVENTS),
		};
	}
	const valid = drained && failedSends === 0 && received === expected && (!limitedFigures || limitedFigures.lost === 0);
	process.stderr.write(`bench delivery: ratelimit burst of ${expected} unlimited${limitedFigures ? ` + ${EVENTS} limited` : ""}: ${valid ? `${Math.round(expected / seconds)}/s` : `INVALID, ${expected - received} missing`} in ${seconds.toFixed(1)} s\n`);
	return {
		unlimited_deliveries: expected,
		received,
		lost: expected - received,
		repeats: receivers.repeats - baseRepeats,
		failed_sends: failedSends,
		valid,
		intake_seconds: round(intakeSeconds),
		seconds: round(seconds),
		unlimited_deliveries_per_s: valid ? round(expected / seconds) : null,
		...(limitedFigures ? { limited: limitedFigures } : {}),
	};
}

/** One round of one mode: a fresh deployment, warmed up with every webhook unlimited, then one burst. */
async function measure(harness: RateLimitHarness, engine: "sqlite" | "postgresql", healthyUrls: string[], limited?: { receivers: Receivers; url: string }): Promise<BurstFigures> {
	const deployment = await harness.deploy({ engine, healthyUrls, neighbourUrls: limited ? [limited.url] : [] });
	try {
		const limitedBefore = limited?.receivers.ok ?? 0;
		await harness.closedLoop(deployment, WARM_UP_EVENTS);
		if (!limited) return await burst(harness, deployment);
		await limited.receivers.waitForOk(limitedBefore + WARM_UP_EVENTS, 60_000);
		const webhookId = await limitWebhook(deployment, limited.url, LIMIT);
		// The dispatcher drops its copy of the webhook on the change's event, which may trail the call's answer.
		await sleep(500);
		return await burst(harness, deployment, { receivers: limited.receivers, webhookId });
	} finally {
		await deployment.stop();
	}
}

async function engineRounds(harness: RateLimitHarness, engine: "sqlite" | "postgresql", healthyUrls: string[], limited: { receivers: Receivers; url: string }) {
	const rounds: { without: BurstFigures[]; with: BurstFigures[] } = { without: [], with: [] };
	for (let turn = 0; turn < ROUNDS; turn++) {
		const order = turn % 2 === 0 ? (["without", "with"] as const) : (["with", "without"] as const);
		for (const mode of order) rounds[mode].push(await measure(harness, engine, healthyUrls, mode === "with" ? limited : undefined));
	}
	const all = [...rounds.without, ...rounds.with];
	const valid = all.every(figures => figures.valid);
	const rates = (figures: BurstFigures[]) => figures.map(f => f.unlimited_deliveries_per_s ?? Number.NaN);
	const limitedOf = rounds.with.map(figures => figures.limited!);
	return {
		valid,
		unlimited_deliveries_per_s_without: rates(rounds.without),
		unlimited_deliveries_per_s_with: rates(rounds.with),
		/** Mean with ÷ mean without; null when any round lost something. */
		unlimited_with_vs_without: valid ? round(mean(rates(rounds.with)) / mean(rates(rounds.without))) : null,
		limited_achieved_vs_limit: limitedOf.map(figures => figures.achieved_vs_limit),
		limited_busiest_second_vs_limit: limitedOf.map(figures => figures.busiest_second_vs_limit),
		rounds,
	};
}

export async function rateLimitScenario(harness: RateLimitHarness, healthyUrls: string[]) {
	const child = await startChild<ReceiverReady>(path.join(__dirname, "receiver.ts"), { RECEIVER_ENDPOINTS: "ok", ...harness.receiverEnv });
	const limitedReceivers = new Receivers(child);
	const limited = { receivers: limitedReceivers, url: `https://127.0.0.1:${limitedReceivers.ports[0]}/hook` };
	const results: Record<string, unknown> = {};
	try {
		for (const engine of ENGINES) {
			process.stderr.write(`bench delivery: ratelimit on ${engine}\n`);
			results[engine] = await engineRounds(harness, engine, healthyUrls, limited);
		}
	} finally {
		await limitedReceivers.stop();
	}
	return {
		limit: LIMIT,
		events_per_webhook: EVENTS,
		unlimited_webhooks: healthyUrls.length,
		rounds: ROUNDS,
		goals: RATE_LIMIT_GOALS,
		...results,
	};
}
