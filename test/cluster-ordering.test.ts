// Ordering per order (issue 31) across dispatcher instances and faults, the roles as real
// `server.ts` processes on PostgreSQL, each cluster with its own nats-server and JetStream.
// Every order has five statuses (committed, staged, in progress twice, then fulfilled, failed or
// expired) with strictly increasing occurred_at, and the next status of an order is sent only
// once the previous one is persisted: in the first two tests a directed `dispatcher.publish` on
// the other instance than the previous status's (so consecutive statuses of an order are taken in
// by different instances), in the third a POST to the HTTP intake, JetStream choosing the
// instance. The receiver answers 500 to about a quarter of first attempts (the same ones on
// every run), so that heads retry while later statuses wait behind them.
// At the receiver, per order: the statuses in the order their webhook-ids were first answered
// 200 must be exactly the order's statuses by occurred_at, none lost; a repeat of a webhook-id
// (allowed across a crash) is counted and printed, and no attempt of an older status may follow
// an attempt of a newer one. One JSON line of figures per test.
import { setTimeout as sleep } from "node:timers/promises";
import { Cluster, describeCluster, eventually, printFigures, withClusterLogs, type ClusterWebhook, type HttpAnswer } from "./helpers/cluster";
import {
	DirectedPublisher,
	ORDERING_CUSTOMER,
	everyRowSucceeded,
	explainMisordered,
	firstAttemptsFailAtRandom,
	headlessSweeps,
	orderFigures,
	plannedOrders,
	queueSnapshot,
	sendOrders,
	waitForEveryStatus,
	watchWaiting,
} from "./helpers/ordering-cluster";
import type { TaskingOrderStatusInput } from "../lib/schemas/events";

const INTAKE = "/id/v3/events/tasking.order_status";
// A head that failed is retried a second later: long enough for the next statuses of its order to
// be taken in and wait behind it, short enough for the test to take seconds.
const ORDERING_ENV = { DELIVERY_RETRY_SCHEDULE: "1s,2s,3s,5s,10s" };

async function perOrderWebhook(cluster: Cluster): Promise<ClusterWebhook> {
	const token = await cluster.token("ada", { customer: ORDERING_CUSTOMER, email: "ada@example.com", name: "Ada" });
	const webhook = await cluster.createWebhook(token, ORDERING_CUSTOMER);
	// Ordered per order without asking: the default.
	const read = await cluster.request("GET", `/id/v3/webhooks/${webhook.id}`, { token });
	expect({ status: read.status, ordering: read.body?.ordering }).toEqual({ status: 200, ordering: "per_order" });
	return webhook;
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
				publish_failed_calls: publisher.failedCalls,
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
			// Fast, as in the test above: a status taken in while the head before it ends, and the next
			// one close behind, is the race a queue must survive (the next must not overtake it).
			const sending = sendOrders(orders, { concurrency: 40, maxGapMs: 30 }, async (event, orderIndex, step) => {
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
				publish_failed_calls: publisher.failedCalls,
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
