// Ordering per order (issue 31) across dispatcher instances and faults, the roles as real
// `server.ts` processes on PostgreSQL, each cluster with its own nats-server and JetStream.
// Every order has five statuses (committed, staged, in progress twice, then fulfilled, failed or
// expired) with strictly increasing occurred_at, and the next status of an order is sent only
// once the previous one is persisted, so that consecutive statuses of one order are taken in by
// different instances. The receiver answers 500 to about a quarter of first attempts (the same
// ones on every run), so that heads retry while later statuses wait behind them.
// At the receiver, per order: the statuses in the order their webhook-ids were first answered
// 200 must be exactly the order's statuses by occurred_at, none lost; a repeat of a webhook-id
// (allowed across a crash) is counted and printed, and no attempt of an older status may follow
// an attempt of a newer one. One JSON line of figures per test.
import crypto from "node:crypto";
import type { ServiceBroker } from "moleculer";
import { Cluster, describeCluster, eventually, printFigures, withClusterLogs, type ClusterWebhook, type HttpAnswer } from "./helpers/cluster";
import { verifyDelivery, type ReceivedRequest, type ScriptedResponse } from "./helpers/https-receiver";
import type { PublishResult } from "../lib/schemas/deliveries";
import type { TaskingOrderStatusInput } from "../lib/schemas/events";

const sleep = (ms: number) => new Promise(resolve => setTimeout(resolve, ms));
const CUSTOMER = "ordering-co";
const INTAKE = "/id/v3/events/tasking.order_status";
const SEED = "issue-31";
const FIRST_ATTEMPT_FAILURE_RATE = 0.25;
// A head that failed is retried a second later: long enough for the next statuses of its order to
// be taken in and wait behind it, short enough for the test to take seconds.
const ORDERING_ENV = { DELIVERY_RETRY_SCHEDULE: "1s,2s,3s,5s,10s" };
// "in progress" twice: a progress update, the same status again (told apart by occurred_at).
const LEAD_STATUSES = ["committed", "staged", "in progress", "in progress"] as const;
const FINAL_STATUSES = ["fulfilled", "failed", "expired"] as const;

/** A number in [0, 1) fixed by the seed and the key: the same on every run. */
function seeded(key: string): number {
	return crypto.createHash("sha256").update(`${SEED}|${key}`).digest().readUInt32BE(0) / 2 ** 32;
}

interface PlannedOrder {
	orderId: string;
	/** Its statuses, in the order they happened (strictly increasing occurred_at). */
	events: TaskingOrderStatusInput[];
}

/** `count` orders of five statuses each, one second apart, the last one cycling through fulfilled, failed and expired. */
function plannedOrders(count: number, prefix: string): PlannedOrder[] {
	const start = Date.now() - 3_600_000;
	return Array.from({ length: count }, (_, index) => {
		const orderId = `${prefix}-${index}`;
		const statuses = [...LEAD_STATUSES, FINAL_STATUSES[index % FINAL_STATUSES.length]];
		const events = statuses.map((status, step) => ({
			event_id: crypto.randomUUID(),
			customer_id: CUSTOMER,
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
function firstAttemptsFailAtRandom(): { respond: (request: ReceivedRequest) => ScriptedResponse; failed(): number } {
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

interface OrderFigures {
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
function orderFigures(cluster: Cluster, webhook: ClusterWebhook, orders: PlannedOrder[]): OrderFigures {
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
async function explainMisordered(cluster: Cluster, webhook: ClusterWebhook, orders: PlannedOrder[], figures: OrderFigures, publisher?: DirectedPublisher): Promise<unknown[]> {
	const explained: unknown[] = [];
	for (const entry of figures.misordered.slice(0, 3)) {
		const order = orders.find(planned => planned.orderId === entry.split(":")[0])!;
		const stepOf = new Map(order.events.map((event, step) => [event.event_id!, step]));
		const rows: Array<Record<string, unknown>> = await cluster
			.db("deliveries")
			.whereIn("event_id", [...stepOf.keys()])
			.select("id", "event_id", "status", "waiting", "attempt_count", "created_at", "updated_at", "first_attempt_at", "last_attempt_at");
		const attempts: Array<Record<string, unknown>> = await cluster
			.db("delivery_attempts")
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
async function waitForEveryStatus(cluster: Cluster, webhook: ClusterWebhook, orders: PlannedOrder[], boundMs: number): Promise<void> {
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
async function everyRowSucceeded(cluster: Cluster, orders: PlannedOrder[]): Promise<Record<string, number>> {
	const statuses = orders.reduce((sum, order) => sum + order.events.length, 0);
	const counts = () =>
		cluster
			.db("deliveries")
			.select(cluster.db.raw("count(*)::int AS rows"), cluster.db.raw("count(*) FILTER (WHERE status = 'succeeded')::int AS succeeded"), cluster.db.raw("count(*) FILTER (WHERE waiting)::int AS waiting"))
			.first() as Promise<Record<string, number>>;
	return eventually(counts, row => row.succeeded >= statuses, "every delivery's result to be written", 60_000);
}

interface QueueSnapshot {
	/** Deliveries waiting behind their order's head. */
	waiting: number;
	/** Heads that were attempted and are due again (a 500 was answered). */
	retrying: number;
	/** Pending deliveries leased to an instance (an attempt in flight, or its result not yet written). */
	leased: number;
}

async function queueSnapshot(cluster: Cluster): Promise<QueueSnapshot> {
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
function watchWaiting(cluster: Cluster): { stop(): Promise<{ seen_waiting: number; most_waiting_at_once: number }> } {
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
class DirectedPublisher {
	readonly down = new Set<string>();
	/** The instance whose answer said the event was persisted (first time, or as a duplicate). */
	readonly takenIn = new Map<string, string>();
	/** Events a fallback instance answered as already persisted (by the instance that did not answer). */
	readonly duplicateEvents = new Set<string>();
	fallbacks = 0;
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

	/** Publishes on nodes[preferred % n], or on the next instance up; `fallback: false` fails instead. */
	async publish(event: TaskingOrderStatusInput, preferred: number, options: { fallback: boolean }): Promise<void> {
		for (let attempt = 0; attempt < 40; attempt++) {
			const node = this.nodes[(preferred + attempt) % this.nodes.length];
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
				if (!options.fallback) throw err;
				this.fallbacks += 1;
				await sleep(200);
			}
		}
		throw new Error(`no dispatcher took event ${event.event_id} in`);
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
async function sendOrders(
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

async function perOrderWebhook(cluster: Cluster): Promise<ClusterWebhook> {
	const token = await cluster.token("ada", { customer: CUSTOMER, email: "ada@example.com", name: "Ada" });
	const webhook = await cluster.createWebhook(token, CUSTOMER);
	// Ordered per order without asking: the default.
	const read = await cluster.request("GET", `/id/v3/webhooks/${webhook.id}`, { token });
	expect({ status: read.status, ordering: read.body?.ordering }).toEqual({ status: 200, ordering: "per_order" });
	return webhook;
}

/** Lines in the dispatchers' logs saying the sweep found a queue with waiting rows and no head. */
function headlessSweeps(cluster: Cluster): number {
	return [...cluster.roles.values()].reduce((sum, role) => sum + (role.tail(100_000).match(/order queues had waiting deliveries and no head/g)?.length ?? 0), 0);
}

describeCluster("cluster ordering per order", () => {
	let cluster: Cluster | undefined;
	afterEach(async () => {
		await cluster?.close();
		cluster = undefined;
	}, 60_000);

	it("two dispatchers on PostgreSQL, consecutive statuses of each order taken in by different instances: every order arrives in order", async () => {
		const receiver = firstAttemptsFailAtRandom();
		cluster = await Cluster.start({ label: "ord-two-instances", env: ORDERING_ENV, respond: receiver.respond });
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			await c.startRoles(["gateway", "gateway"], ["dispatcher", "dispatcher-1"], ["dispatcher", "dispatcher-2"]);
			const webhook = await perOrderWebhook(c);
			const publisher = new DirectedPublisher(await c.producer(), [`${c.namespace}-dispatcher-1`, `${c.namespace}-dispatcher-2`]);
			await publisher.ready();
			const orders = plannedOrders(200, "two");

			const waiting = watchWaiting(c);
			// Status k of order i goes to instance (i + k) mod 2: never two in a row to the same one.
			await sendOrders(orders, { concurrency: 40, maxGapMs: 30 }, (event, orderIndex, step) => publisher.publish(event, orderIndex + step, { fallback: false }));
			await waitForEveryStatus(c, webhook, orders, 120_000);
			const rows = await everyRowSucceeded(c, orders);
			const waited = await waiting.stop();

			const figures = orderFigures(c, webhook, orders);
			if (figures.out_of_order > 0) console.log(JSON.stringify(await explainMisordered(c, webhook, orders, figures, publisher), null, 1));
			printFigures("ordering: two dispatchers", {
				...figures,
				cross_instance_pairs: publisher.crossInstancePairs(orders),
				first_attempts_failed: receiver.failed(),
				...waited,
				rows,
				headless_sweeps: headlessSweeps(c),
			});
			expect(figures).toMatchObject({ statuses: 1_000, lost: 0, out_of_order: 0, older_after_newer: 0, split_deliveries: 0, bad_signatures: 0, wrong_payloads: 0 });
			expect(publisher.crossInstancePairs(orders)).toBe(200 * 4);
			expect(rows).toEqual({ rows: 1_000, succeeded: 1_000, waiting: 0 });
			// The run did what it is meant to show: heads failed and later statuses waited behind them.
			expect(receiver.failed()).toBeGreaterThan(0);
			expect(waited.seen_waiting).toBeGreaterThan(0);
		});
	}, 240_000);

	it("a dispatcher SIGKILLed between statuses of orders, then restarted: every order arrives in order, none lost", async () => {
		const receiver = firstAttemptsFailAtRandom();
		cluster = await Cluster.start({ label: "ord-kill-dispatcher", env: ORDERING_ENV, respond: receiver.respond });
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			await c.startRoles(["gateway", "gateway"], ["dispatcher", "dispatcher-1"], ["dispatcher", "dispatcher-2"]);
			const webhook = await perOrderWebhook(c);
			const killed = `${c.namespace}-dispatcher-1`;
			const publisher = new DirectedPublisher(await c.producer(), [killed, `${c.namespace}-dispatcher-2`]);
			await publisher.ready();
			const orders = plannedOrders(200, "kill");
			const total = orders.length * 5;

			const waiting = watchWaiting(c);
			// The last third waits for the killed instance to be back, so that it takes statuses in again.
			let restarted = () => {};
			const back = new Promise<void>(resolve => (restarted = resolve));
			const sending = sendOrders(orders, { concurrency: 20, maxGapMs: 400 }, async (event, orderIndex, step) => {
				if (publisher.published >= (total * 2) / 3) await back;
				await publisher.publish(event, orderIndex + step, { fallback: true });
			});
			// Mid-run: a third of the statuses in, heads retrying and later statuses waiting behind them.
			const atKill = await eventually(
				async () => ({ published: publisher.published, ...(await queueSnapshot(c)) }),
				state => state.published >= total / 3 && state.waiting > 0 && state.retrying > 0,
				"a third of the statuses in, with heads retrying and statuses waiting",
			);
			const attemptsOfKilled = await c.role("dispatcher-1").metric("webhook_delivery_attempts_total");
			// Stalled for a second before the kill, as a machine can be: it dies holding leases on
			// heads (attempts answered but never written) and publishes it never answered.
			publisher.down.add(killed);
			c.role("dispatcher-1").freeze();
			await sleep(1_000);
			const inFlightAtKill = c.received(webhook).filter(request => request.answeredStatus === undefined).length;
			const exit = await c.role("dispatcher-1").kill("SIGKILL");
			expect(exit.signal).toBe("SIGKILL");
			const publishedAtKill = publisher.published;
			const leasedAtKill = (await queueSnapshot(c)).leased;

			// The survivor carries on alone for a while, then the killed one comes back and takes its share again.
			await sleep(3_000);
			await c.restart("dispatcher-1");
			publisher.down.delete(killed);
			const takenInBeforeRestart = new Set(publisher.takenIn.keys());
			restarted();
			await sending;
			await waitForEveryStatus(c, webhook, orders, 150_000);
			const rows = await everyRowSucceeded(c, orders);
			const waited = await waiting.stop();

			const takenInByRestarted = [...publisher.takenIn].filter(([eventId, node]) => node === killed && !takenInBeforeRestart.has(eventId)).length;
			const figures = orderFigures(c, webhook, orders);
			if (figures.out_of_order > 0) console.log(JSON.stringify(await explainMisordered(c, webhook, orders, figures, publisher), null, 1));
			printFigures("ordering: SIGKILL a dispatcher between statuses", {
				...figures,
				cross_instance_pairs: publisher.crossInstancePairs(orders),
				first_attempts_failed: receiver.failed(),
				...waited,
				at_kill: { ...atKill, published_at_kill: publishedAtKill, leased: leasedAtKill, in_flight: inFlightAtKill, attempts_of_killed: attemptsOfKilled },
				publish_fallbacks: publisher.fallbacks,
				publish_duplicates: publisher.duplicates,
				taken_in_by_restarted: takenInByRestarted,
				rows,
				headless_sweeps: headlessSweeps(c),
			});
			// A repeat of a webhook-id is allowed across a crash; an older status after a newer one never.
			expect(figures).toMatchObject({ statuses: total, lost: 0, out_of_order: 0, older_after_newer: 0, split_deliveries: 0, bad_signatures: 0, wrong_payloads: 0 });
			expect(rows).toEqual({ rows: total, succeeded: total, waiting: 0 });
			// The kill landed mid-run, with heads retrying and statuses waiting, while the killed
			// instance was working; and the restarted one took statuses in again.
			expect(publishedAtKill).toBeLessThan(total);
			expect(atKill.waiting).toBeGreaterThan(0);
			expect(atKill.retrying).toBeGreaterThan(0);
			expect(attemptsOfKilled).toBeGreaterThan(0);
			expect(publisher.crossInstancePairs(orders)).toBeGreaterThan(0);
			expect(takenInByRestarted).toBeGreaterThan(0);
		});
	}, 300_000);

	it("through the HTTP intake and JetStream, each status posted once the previous one's delivery exists, across a dispatcher SIGKILL and restart: in order", async () => {
		const receiver = firstAttemptsFailAtRandom();
		cluster = await Cluster.start({ label: "ord-http-intake", env: ORDERING_ENV, respond: receiver.respond });
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			await c.startRoles(["gateway", "gateway"], ["dispatcher", "dispatcher-1"], ["dispatcher", "dispatcher-2"]);
			const webhook = await perOrderWebhook(c);
			const producerToken = await c.token("orders-service", { scope: "events:publish" });
			const intake = await c.watchIntake("dispatcher");
			const orders = plannedOrders(60, "http");
			const total = orders.length * 5;

			// One poller for every status waiting for its delivery row (not one query per order).
			const awaited = new Map<string, () => void>();
			let polling = true;
			const poller = (async () => {
				while (polling) {
					const ids = [...awaited.keys()];
					if (ids.length > 0) {
						try {
							const rows: Array<{ event_id: string }> = await c.db("deliveries").whereIn("event_id", ids).select("event_id");
							for (const { event_id } of rows) {
								awaited.get(event_id)?.();
								awaited.delete(event_id);
							}
						} catch {
							// the next round
						}
					}
					await sleep(50);
				}
			})();
			const answers: HttpAnswer[] = [];
			let posted = 0;
			const post = async (event: TaskingOrderStatusInput) => {
				const persisted = new Promise<void>(resolve => awaited.set(event.event_id!, resolve));
				answers.push(await c.request("POST", INTAKE, { token: producerToken, body: [event] }));
				posted += 1;
				await persisted;
			};

			const waiting = watchWaiting(c);
			const sending = sendOrders(orders, { concurrency: 10, maxGapMs: 400 }, event => post(event));
			const atKill = await eventually(
				async () => ({ posted, ...(await queueSnapshot(c)) }),
				state => state.posted >= total / 3 && state.waiting > 0,
				"a third of the statuses in, with statuses waiting",
			);
			// Stalled, then killed: it dies holding events JetStream handed it and it never acknowledged.
			c.role("dispatcher-1").freeze();
			await sleep(1_000);
			await c.role("dispatcher-1").kill("SIGKILL");
			const postedAtKill = posted;
			await sleep(3_000);
			await c.restart("dispatcher-1");
			await sending;
			polling = false;
			await poller;
			await waitForEveryStatus(c, webhook, orders, 150_000);
			const rows = await everyRowSucceeded(c, orders);
			const waited = await waiting.stop();

			const figures = orderFigures(c, webhook, orders);
			if (figures.out_of_order > 0) console.log(JSON.stringify(await explainMisordered(c, webhook, orders, figures), null, 1));
			printFigures("ordering: HTTP intake across a dispatcher SIGKILL", {
				...figures,
				first_attempts_failed: receiver.failed(),
				...waited,
				at_kill: { ...atKill, posted_at_kill: postedAtKill },
				events_redelivered: intake.redelivered(),
				rows,
				headless_sweeps: headlessSweeps(c),
			});
			expect(answers.map(answer => answer.status)).toEqual(answers.map(() => 202));
			expect(figures).toMatchObject({ statuses: total, lost: 0, out_of_order: 0, older_after_newer: 0, split_deliveries: 0, bad_signatures: 0, wrong_payloads: 0 });
			expect(rows).toEqual({ rows: total, succeeded: total, waiting: 0 });
			expect(postedAtKill).toBeLessThan(total);
		});
	}, 300_000);
});
