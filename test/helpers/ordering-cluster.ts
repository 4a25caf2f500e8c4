// The parts of the cluster ordering tests (test/cluster-ordering.test.ts) that plan the orders,
// send them, answer them at the receiver and count what arrived, per order and in which order.
//
//   const orders = plannedOrders(200, "run");             // five statuses each, by occurred_at
//   const receiver = firstAttemptsFailAtRandom();          // Cluster.start({ respond: receiver.respond })
//   await sendOrders(orders, { concurrency: 40, maxGapMs: 30 }, send);  // each order's statuses in turn
//   orderFigures(cluster, webhook, orders)                 // lost, out_of_order, repeats, …
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import type { ServiceBroker } from "moleculer";
import { eventually, type Cluster, type ClusterWebhook } from "./cluster";
import { verifyDelivery, type ReceivedRequest, type ScriptedResponse } from "./https-receiver";
import type { PublishResult } from "../../lib/schemas/deliveries";
import type { TaskingOrderStatusInput } from "../../lib/schemas/events";

/** The customer of every order these tests send. */
export const ORDERING_CUSTOMER = "ordering-co";
const SEED = "issue-31";
const FIRST_ATTEMPT_FAILURE_RATE = 0.25;
// "in progress" twice: a progress update, the same status again (told apart by occurred_at).
const LEAD_STATUSES = ["committed", "staged", "in progress", "in progress"] as const;
const FINAL_STATUSES = ["fulfilled", "failed", "expired"] as const;

/** A number in [0, 1) fixed by the seed and the key: the same on every run. */
export function seeded(key: string): number {
	return crypto.createHash("sha256").update(`${SEED}|${key}`).digest().readUInt32BE(0) / 2 ** 32;
}

export interface PlannedOrder {
	orderId: string;
	/** Its statuses, in the order they happened (strictly increasing occurred_at). */
	events: TaskingOrderStatusInput[];
}

/** `count` orders of five statuses each, one second apart, the last one cycling through fulfilled, failed and expired. */
export function plannedOrders(count: number, prefix: string): PlannedOrder[] {
	const start = Date.now() - 3_600_000;
	return Array.from({ length: count }, (_, index) => {
		const orderId = `${prefix}-${index}`;
		const statuses = [...LEAD_STATUSES, FINAL_STATUSES[index % FINAL_STATUSES.length]];
		const events = statuses.map((status, step) => ({
			event_id: crypto.randomUUID(),
			customer_id: ORDERING_CUSTOMER,
			user_id: "ada",
			order_id: orderId,
			status,
			previous_status: step === 0 ? undefined : statuses[step - 1],
			occurred_at: new Date(start + index * 10 + step * 1_000).toISOString(),
			details: { step },
		}));
		return { orderId, events };
	});
}

/**
 * The receiver's answer: 500 to the first attempt of the statuses the seed picks, 200 to every
 * other request, a few milliseconds later (so that attempts are in flight when a fault lands).
 */
export function firstAttemptsFailAtRandom(): { respond: (request: ReceivedRequest) => ScriptedResponse; failed(): number } {
	const seen = new Set<string>();
	let failed = 0;
	return {
		respond: request => {
			const id = String(request.headers["webhook-id"]);
			const first = !seen.has(id);
			seen.add(id);
			let key = "";
			try {
				const { data, timestamp } = JSON.parse(request.body);
				key = `${data?.order_id}|${timestamp}`;
			} catch {
				// Counted as a wrong payload by orderFigures.
			}
			if (first && seeded(key) < FIRST_ATTEMPT_FAILURE_RATE) {
				failed += 1;
				return { status: 500, body: "try later", delayMs: 5 };
			}
			return { status: 200, delayMs: 5 + Math.floor(seeded(`delay|${id}`) * 15) };
		},
		failed: () => failed,
	};
}

export interface OrderFigures {
	orders: number;
	statuses: number;
	/** Statuses never answered 200. */
	lost: number;
	/** Orders whose statuses, in the order their webhook-ids were first answered 200, are not the order's statuses by occurred_at. */
	out_of_order: number;
	/** Orders where a request for an older status (any answer) arrived after one for a newer status. */
	older_after_newer: number;
	/** 200s beyond the first for one webhook-id. */
	repeats: number;
	/** Statuses of an order delivered under more than one webhook-id (one event in two delivery rows). */
	split_deliveries: number;
	requests: number;
	failed_answers: number;
	bad_signatures: number;
	/** Verified payloads whose order, status or time is not one of the plan's. */
	wrong_payloads: number;
	/** A few misordered orders, as the status indexes first answered 200, for the log. */
	misordered: string[];
	repeated: string[];
}

/** Counts, per order, what the receiver answered 200 for this webhook and in which order. */
export function orderFigures(cluster: Cluster, webhook: ClusterWebhook, orders: PlannedOrder[]): OrderFigures {
	const planOf = new Map(orders.map(order => [order.orderId, order]));
	const arrivals = new Map<string, Array<{ index: number; webhookId: string; answered?: number }>>();
	let requests = 0;
	let failedAnswers = 0;
	let badSignatures = 0;
	let wrongPayloads = 0;
	for (const request of cluster.received(webhook)) {
		requests += 1;
		if (request.answeredStatus !== 200) failedAnswers += 1;
		let payload: { timestamp?: string; data?: { order_id?: string; status?: string } };
		try {
			payload = verifyDelivery(request, webhook.secret) as typeof payload;
		} catch {
			badSignatures += 1;
			continue;
		}
		const plan = planOf.get(String(payload.data?.order_id));
		const index = plan ? plan.events.findIndex(event => event.occurred_at === payload.timestamp) : -1;
		if (!plan || index < 0 || payload.data?.status !== plan.events[index].status || (payload.data as { step?: unknown }).step !== index) {
			wrongPayloads += 1;
			continue;
		}
		const list = arrivals.get(plan.orderId) ?? [];
		list.push({ index, webhookId: String(request.headers["webhook-id"]), answered: request.answeredStatus });
		arrivals.set(plan.orderId, list);
	}
	let lost = 0;
	let outOfOrder = 0;
	let olderAfterNewer = 0;
	let repeats = 0;
	let split = 0;
	const misordered: string[] = [];
	const repeated: string[] = [];
	for (const order of orders) {
		const list = arrivals.get(order.orderId) ?? [];
		const firstAnswered = new Map<string, number>();
		let newest = -1;
		let backwards = false;
		for (const { index, webhookId, answered } of list) {
			if (index < newest) backwards = true;
			newest = Math.max(newest, index);
			if (answered !== 200) continue;
			if (firstAnswered.has(webhookId)) {
				repeats += 1;
				repeated.push(`${order.orderId}#${index}`);
			} else firstAnswered.set(webhookId, index);
		}
		const sequence = [...firstAnswered.values()];
		const expected = order.events.map((_, index) => index);
		lost += expected.filter(index => !sequence.includes(index)).length;
		if (sequence.join() !== expected.join()) {
			outOfOrder += 1;
			misordered.push(`${order.orderId}: ${sequence.join(",")}`);
		}
		if (backwards) olderAfterNewer += 1;
		for (const index of expected) if (new Set(list.filter(arrival => arrival.index === index).map(arrival => arrival.webhookId)).size > 1) split += 1;
	}
	return {
		orders: orders.length,
		statuses: orders.reduce((sum, order) => sum + order.events.length, 0),
		lost,
		out_of_order: outOfOrder,
		older_after_newer: olderAfterNewer,
		repeats,
		split_deliveries: split,
		requests,
		failed_answers: failedAnswers,
		bad_signatures: badSignatures,
		wrong_payloads: wrongPayloads,
		misordered: misordered.slice(0, 10),
		repeated: repeated.slice(0, 10),
	};
}

/**
 * For a failure message: what the database and the receiver say about the first misordered
 * orders (each status's delivery row and attempts, and the requests in the order they came).
 */
export async function explainMisordered(cluster: Cluster, webhook: ClusterWebhook, orders: PlannedOrder[], figures: OrderFigures, publisher?: DirectedPublisher): Promise<unknown[]> {
	const explained: unknown[] = [];
	for (const entry of figures.misordered.slice(0, 3)) {
		const order = orders.find(planned => planned.orderId === entry.split(":")[0])!;
		const stepOf = new Map(order.events.map((event, step) => [event.event_id!, step]));
		const rows: Array<Record<string, unknown>> = await cluster
			.db("deliveries")
			.whereIn("event_id", [...stepOf.keys()])
			.select("id", "event_id", "status", "waiting", "attempt_count", "created_at", "updated_at", "first_attempt_at", "last_attempt_at");
		const attempts: Array<Record<string, unknown>> = await cluster
			.db("delivery_attempt_log")
			.whereIn("delivery_id", rows.map(row => row.id as string))
			.select("delivery_id", "attempt", "attempted_at", "status_code");
		explained.push({
			order: entry,
			rows: rows
				.map(row => ({
					...row,
					step: stepOf.get(row.event_id as string),
					taken_in_by: publisher?.takenIn.get(row.event_id as string),
					answered_as_duplicate: publisher?.duplicateEvents.has(row.event_id as string),
					attempts: attempts.filter(attempt => attempt.delivery_id === row.id).map(attempt => `${attempt.attempt}@${attempt.attempted_at}:${attempt.status_code}`),
				}))
				.sort((a, b) => a.step! - b.step!),
			requests: cluster
				.received(webhook)
				.filter(request => request.body.includes(`"${order.orderId}"`))
				.map(request => `${request.headers["webhook-id"]} ${JSON.parse(request.body).timestamp} ${request.receivedAt.toISOString()} ${request.answeredStatus}`),
		});
	}
	return explained;
}

/** Waits (bounded) until every planned status of this webhook was answered 200 (cheap: no signature checks). */
export async function waitForEveryStatus(cluster: Cluster, webhook: ClusterWebhook, orders: PlannedOrder[], boundMs: number): Promise<void> {
	const wanted = new Set(orders.flatMap(order => order.events.map(event => `${order.orderId}|${event.occurred_at}`)));
	const answered = () => {
		const keys = new Set<string>();
		for (const request of cluster.received(webhook)) {
			if (request.answeredStatus !== 200) continue;
			try {
				const { data, timestamp } = JSON.parse(request.body);
				const key = `${data?.order_id}|${timestamp}`;
				if (wanted.has(key)) keys.add(key);
			} catch {
				// orderFigures counts it
			}
		}
		return keys.size;
	};
	await eventually(answered, count => count >= wanted.size, `${wanted.size} statuses answered 200`, boundMs).catch(err => {
		throw new Error(`${(err as Error).message}\n${cluster.logs()}`);
	});
}

/** Once every status arrived: every delivery row is written as succeeded, none is left waiting. */
export async function everyRowSucceeded(cluster: Cluster, orders: PlannedOrder[]): Promise<Record<string, number>> {
	const statuses = orders.reduce((sum, order) => sum + order.events.length, 0);
	const counts = () =>
		cluster
			.db("deliveries")
			.select(cluster.db.raw("count(*)::int AS rows"), cluster.db.raw("count(*) FILTER (WHERE status = 'succeeded')::int AS succeeded"), cluster.db.raw("count(*) FILTER (WHERE waiting)::int AS waiting"))
			.first() as Promise<Record<string, number>>;
	return eventually(counts, row => row.succeeded >= statuses, "every delivery's result to be written", 60_000);
}

export interface QueueSnapshot {
	/** Deliveries waiting behind their order's head. */
	waiting: number;
	/** Heads that were attempted and are due again (a 500 was answered). */
	retrying: number;
	/** Pending deliveries leased to an instance (an attempt in flight, or its result not yet written). */
	leased: number;
}

export async function queueSnapshot(cluster: Cluster): Promise<QueueSnapshot> {
	const row = await cluster.db("deliveries").first(
		cluster.db.raw("count(*) FILTER (WHERE status = 'pending' AND waiting)::int AS waiting"),
		cluster.db.raw("count(*) FILTER (WHERE status = 'pending' AND NOT waiting AND attempt_count > 0)::int AS retrying"),
		cluster.db.raw("count(*) FILTER (WHERE status = 'pending' AND lease_id IS NOT NULL)::int AS leased"),
	);
	return row as QueueSnapshot;
}

/**
 * Watches the deliveries table while the test runs and collects the deliveries it sees waiting
 * (every 100 ms: a lower bound, a delivery that waited less long may be missed).
 */
export function watchWaiting(cluster: Cluster): { stop(): Promise<{ seen_waiting: number; most_waiting_at_once: number }> } {
	const seen = new Set<string>();
	let most = 0;
	let running = true;
	const loop = (async () => {
		while (running) {
			try {
				const rows: Array<{ id: string }> = await cluster.db("deliveries").select("id").where({ status: "pending", waiting: true });
				for (const row of rows) seen.add(row.id);
				most = Math.max(most, rows.length);
			} catch {
				// The cluster is closing.
			}
			await sleep(100);
		}
	})();
	return {
		async stop() {
			running = false;
			await loop;
			return { seen_waiting: seen.size, most_waiting_at_once: most };
		},
	};
}

/**
 * Publishes through `dispatcher.publish` on a chosen dispatcher instance (a directed call from an
 * outside Moleculer node), so that the test decides which instance takes each status in. An
 * instance marked down, or one that does not answer, is passed over for the next one; a repeat
 * of an event that was persisted after all is harmless (its event_id).
 */
export class DirectedPublisher {
	readonly down = new Set<string>();
	/** The instance whose answer said the event was persisted (first time, or as a duplicate). */
	readonly takenIn = new Map<string, string>();
	/** Events a fallback instance answered as already persisted (by the instance that did not answer). */
	readonly duplicateEvents = new Set<string>();
	/** Calls that failed (no answer in time, or an error) and were made again. */
	failedCalls = 0;
	duplicates = 0;
	published = 0;

	constructor(
		private readonly broker: ServiceBroker,
		readonly nodes: string[],
	) {}

	async ready(): Promise<void> {
		await eventually(
			() => {
				const available = this.broker.registry.getServiceList({ onlyAvailable: true }) as Array<{ name: string; nodeID?: string }>;
				return this.nodes.every(node => available.some(service => service.name === "dispatcher" && service.nodeID === node));
			},
			ready => ready,
			"both dispatchers to be known to the publisher",
		);
	}

	/**
	 * Publishes on nodes[preferred % n], or, when it fails, on the next instance up; with
	 * `fallback: false` on the same instance again (an instance just started may not know the
	 * webhooks service yet, and answers with an error a producer retries).
	 */
	async publish(event: TaskingOrderStatusInput, preferred: number, options: { fallback: boolean }): Promise<void> {
		let lastError: unknown = "every instance marked down";
		for (let attempt = 0; attempt < 40; attempt++) {
			const node = this.nodes[(preferred + (options.fallback ? attempt : 0)) % this.nodes.length];
			if (this.down.has(node)) continue;
			try {
				const result = await this.broker.call<PublishResult, TaskingOrderStatusInput>("dispatcher.publish", event, { nodeID: node, timeout: 5_000 });
				if (result.duplicate) {
					this.duplicates += 1;
					this.duplicateEvents.add(event.event_id!);
				}
				this.takenIn.set(event.event_id!, node);
				this.published += 1;
				return;
			} catch (err) {
				lastError = err;
				this.failedCalls += 1;
				await sleep(200);
			}
		}
		throw new Error(`no dispatcher took event ${event.event_id} in: ${(lastError as Error).message ?? lastError}`);
	}

	/** Consecutive statuses of one order that were taken in by different instances. */
	crossInstancePairs(orders: PlannedOrder[]): number {
		let pairs = 0;
		for (const { events } of orders) for (let step = 1; step < events.length; step++) if (this.takenIn.get(events[step].event_id!) !== this.takenIn.get(events[step - 1].event_id!)) pairs += 1;
		return pairs;
	}
}

/**
 * Sends the orders, `concurrency` of them at a time: each order's statuses one after another, the
 * next once `send` resolved for the previous one, with a seeded pause of up to `maxGapMs` in
 * between (a fault test paces its run, so that the fault and the restart land while statuses
 * still come in).
 */
export async function sendOrders(
	orders: PlannedOrder[],
	{ concurrency, maxGapMs }: { concurrency: number; maxGapMs: number },
	send: (event: TaskingOrderStatusInput, orderIndex: number, step: number) => Promise<void>,
): Promise<void> {
	let next = 0;
	const worker = async () => {
		while (next < orders.length) {
			const orderIndex = next++;
			const { events } = orders[orderIndex];
			for (let step = 0; step < events.length; step++) {
				await send(events[step], orderIndex, step);
				await sleep(Math.floor(seeded(`gap|${orders[orderIndex].orderId}|${step}`) * maxGapMs));
			}
		}
	};
	await Promise.all(Array.from({ length: concurrency }, worker));
}

/** Lines in the dispatchers' logs saying the sweep found a queue with waiting rows and no head. */
export function headlessSweeps(cluster: Cluster): number {
	return [...cluster.roles.values()].reduce((sum, role) => sum + (role.tail(100_000).match(/order queues had waiting deliveries and no head/g)?.length ?? 0), 0);
}
