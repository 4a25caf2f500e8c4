// Ordering per order (API.md, "Ordering per order"), every edge end to end on SQLite and
// PostgreSQL: the real dispatcher, a real HTTPS receiver, the real gateway for the API answers.
// Order and loss are counted at the receiver: the order in which it answered 200 per order,
// each delivery's webhook-id once (a repeat would show as a second 200 for one webhook-id).
// The receiver's answers are scripted by what has happened, not by the clock: a head fails until
// the deliveries that must not wait for it have arrived.
import crypto from "node:crypto";
import { testDatabases } from "./helpers/services";
import { newCustomer, orderEvent, startDeliveryStack, verified, waitUntil, type CreatedWebhook, type DeliveryStack, type OrderEvent, type TestCustomer } from "./helpers/delivery-stack";
import type { ScriptedResponse } from "./helpers/https-receiver";
import { PARKED_RECHECK_POLLS, type DispatcherThis } from "../mixins/dispatcher/shared";

/** One answer the receiver gave, in the order it gave them. */
interface Answer {
	/** The status's label (its order_name), or the message type for other messages. */
	label: string;
	orderId: string | null;
	type: string;
	messageId: string;
	status: number;
}

/** Decides the answer to one request: its label and the how-manieth request of that label it is. */
type Decide = (label: string, attempt: number) => ScriptedResponse | Promise<ScriptedResponse>;

const OK: ScriptedResponse = { status: 200, body: "ok" };
const FAIL: ScriptedResponse = { status: 500, body: "not now" };

interface ApiDelivery {
	id: string;
	status: string;
	next_attempt_at: string | null;
	waiting_for: string | null;
	attempt_count: number;
}

describe.each(testDatabases())("ordering per order on %s", database => {
	let env: DeliveryStack;
	const db = () => env.stack.db;
	const dispatcher = () => env.stack.app.broker.getLocalService("dispatcher") as unknown as DispatcherThis;
	const publish = (event: OrderEvent) => env.stack.app.broker.call("dispatcher.publish", event) as Promise<{ event_id: string; duplicate: boolean; deliveries: number }>;

	/** Records every answer the webhook's receiver path gives, as `decide` scripts it. */
	function answering(webhook: CreatedWebhook, decide: Decide = () => OK): Answer[] {
		const answers: Answer[] = [];
		const attempts = new Map<string, number>();
		env.script(webhook, [], async request => {
			const payload = verified(request, webhook.secret);
			const label: string = payload.data?.order_name ?? payload.type;
			const attempt = (attempts.get(label) ?? 0) + 1;
			attempts.set(label, attempt);
			const answer = await decide(label, attempt);
			answers.push({ label, orderId: payload.data?.order_id ?? null, type: payload.type, messageId: String(request.headers["webhook-id"]), status: answer.status ?? 200 });
			return answer;
		});
		return answers;
	}

	/** The labels answered 200, in the order the receiver answered them (of one order if given). */
	const delivered = (answers: Answer[], orderId?: string) => answers.filter(answer => answer.status === 200 && (orderId === undefined || answer.orderId === orderId)).map(answer => answer.label);
	const hasDelivered = (answers: Answer[], label: string) => delivered(answers).includes(label);

	/** Each label delivered once, with its own webhook-id, and no webhook-id answered 200 twice. */
	function expectEachOnce(answers: Answer[], labels: string[]): void {
		const succeeded = answers.filter(answer => answer.status === 200 && labels.includes(answer.label));
		expect(succeeded.map(answer => answer.label).sort()).toEqual([...labels].sort());
		expect(new Set(succeeded.map(answer => answer.messageId)).size).toBe(labels.length);
		// Every attempt of one status carries the same webhook-id, whatever its outcome.
		for (const label of labels) expect(new Set(answers.filter(answer => answer.label === label).map(answer => answer.messageId)).size).toBe(1);
	}

	let clock = Date.parse("2026-06-01T00:00:00Z");
	/** A status of `orderId` labelled `label` (its order_name), happened `secondsAfter` a base fresh per call site. */
	const statusOf = (customer: TestCustomer, orderId: string, label: string, status: OrderEvent["status"], occurredAt: number) =>
		orderEvent(customer, { order_id: orderId, order_name: label, status, occurred_at: new Date(occurredAt).toISOString() });
	/** A fresh base time for a test's occurred_at values, an hour after the previous one. */
	const freshBase = () => (clock += 3_600_000);
	const newOrderId = () => `order-${crypto.randomBytes(4).toString("hex")}`;

	const rowOf = (eventId: string, webhook: CreatedWebhook) => db()("deliveries").where({ event_id: eventId, webhook_id: webhook.id }).first();
	const rowWhen = (eventId: string, webhook: CreatedWebhook, done: (row: any) => boolean, what: string) => waitUntil(() => rowOf(eventId, webhook), row => row !== undefined && done(row), what);
	const isTrue = (value: unknown) => value === true || value === 1;

	const listed = async (webhook: CreatedWebhook, token: string): Promise<ApiDelivery[]> => {
		const response = await env.stack.request("GET", `/id/v3/webhooks/${webhook.id}/deliveries`, { token });
		expect(response.status).toBe(200);
		return response.body.deliveries;
	};
	const shown = async (webhook: CreatedWebhook, token: string, deliveryId: string): Promise<ApiDelivery> => {
		const response = await env.stack.request("GET", `/id/v3/webhooks/${webhook.id}/deliveries/${deliveryId}`, { token });
		expect(response.status).toBe(200);
		return response.body;
	};

	/** The API shows the delivery waiting for `headId`, in the list and on its own. */
	async function expectWaitingFor(webhook: CreatedWebhook, token: string, deliveryId: string, headId: string): Promise<void> {
		const waiting = { id: deliveryId, status: "pending", next_attempt_at: null, waiting_for: headId, attempt_count: 0 };
		expect((await listed(webhook, token)).find(delivery => delivery.id === deliveryId)).toMatchObject(waiting);
		expect(await shown(webhook, token, deliveryId)).toMatchObject(waiting);
	}

	/** Resolves once the dispatcher's poll loop has run a sweep (and parked re-check) after now. */
	async function aSweepLater(): Promise<void> {
		const from = dispatcher().polls;
		const sweepAt = (Math.floor(from / PARKED_RECHECK_POLLS) + 1) * PARKED_RECHECK_POLLS;
		await waitUntil(() => dispatcher().polls, polls => polls > sweepAt, "a sweep of the poll loop");
	}

	const patch = (webhook: CreatedWebhook, token: string, body: unknown) => env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token, body });

	beforeAll(async () => {
		// Three quick retries: a head that keeps failing ends within seconds. The poll loop runs
		// every 100 ms, so a sweep comes every PARKED_RECHECK_POLLS x 100 ms.
		env = await startDeliveryStack(database, { env: { DELIVERY_RETRY_SCHEDULE: "1s,2s,3s", DELIVERY_POLL_INTERVAL: "100ms" } });
	});
	afterAll(() => env?.stop());

	it("delivers an order's statuses one at a time in occurred_at order; other orders and other webhooks do not wait", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const sibling = await env.createWebhook(alice.token);
		const order = newOrderId();
		const other = newOrderId();
		const base = freshBase();
		const siblingAnswers = answering(sibling);
		// A1 fails its first attempt, and then until the other order and the other webhook have had theirs.
		const answers = answering(webhook, (label, attempt) => {
			if (label !== "A1") return OK;
			if (attempt === 1) return FAIL;
			return hasDelivered(answers, "B1") && delivered(siblingAnswers, order).length === 3 ? OK : FAIL;
		});

		const a1 = statusOf(alice, order, "A1", "committed", base);
		await publish(a1);
		const head = await rowWhen(a1.event_id!, webhook, row => row.attempt_count === 1, "A1's first attempt");
		expect(head.status).toBe("pending");
		// The other webhook's A1 goes at once; done before A3 and A2 come, so that each of them goes
		// as it comes there (on a loaded machine it was once still in flight, and they waited).
		await rowWhen(a1.event_id!, sibling, row => row.status === "succeeded", "the other webhook's A1");

		// Published in another order than they happened: A3 first.
		const a3 = statusOf(alice, order, "A3", "in progress", base + 2_000);
		const a2 = statusOf(alice, order, "A2", "staged", base + 1_000);
		expect(await publish(a3)).toMatchObject({ duplicate: false, deliveries: 2 });
		expect(await publish(a2)).toMatchObject({ duplicate: false, deliveries: 2 });
		const waitingA2 = await rowOf(a2.event_id!, webhook);
		const waitingA3 = await rowOf(a3.event_id!, webhook);
		for (const row of [waitingA2, waitingA3]) {
			expect(row).toMatchObject({ status: "pending", order_key: order, next_attempt_at: null, lease_id: null, attempt_count: 0 });
			expect(isTrue(row.waiting)).toBe(true);
		}
		// A1 cannot have succeeded yet: B1 is not even published.
		await expectWaitingFor(webhook, alice.token, waitingA2.id, head.id);
		await expectWaitingFor(webhook, alice.token, waitingA3.id, head.id);
		expect((await listed(webhook, alice.token)).find(delivery => delivery.id === head.id)).toMatchObject({ status: "pending", waiting_for: null });

		const b1 = statusOf(alice, other, "B1", "committed", base);
		await publish(b1);

		await rowWhen(a3.event_id!, webhook, row => row.status === "succeeded", "A3 to be delivered");
		// The other order went while A1 was failing, not after it: A1 was retried, and its success
		// came after B1's. Not "before A1's first retry": that comes 1 s after its first attempt, and
		// on a slow machine the checks above can take longer before B1 is even published.
		const a1Retry = answers.findIndex((answer, i) => answer.label === "A1" && i > answers.findIndex(first => first.label === "A1"));
		expect(a1Retry).toBeGreaterThan(0);
		const a1Success = answers.findIndex(answer => answer.label === "A1" && answer.status === 200);
		expect(answers.findIndex(answer => answer.label === "B1" && answer.status === 200)).toBeLessThan(a1Success);
		expect(delivered(answers, order)).toEqual(["A1", "A2", "A3"]);
		expect(delivered(answers, other)).toEqual(["B1"]);
		expectEachOnce(answers, ["A1", "A2", "A3", "B1"]);
		// The other webhook has its own queue: all three while A1 still failed here. Its A1 was
		// delivered before A3 and A2 were published, so each went as it came (API.md: an event
		// older than one already delivered goes at once, one arriving behind a pending head waits).
		expect(delivered(siblingAnswers, order)).toEqual(["A1", "A3", "A2"]);
		expectEachOnce(siblingAnswers, ["A1", "A2", "A3", "B1"]);
		expect(siblingAnswers.every(answer => answer.status === 200)).toBe(true);
		// Once done, nothing is shown waiting.
		expect((await listed(webhook, alice.token)).every(delivery => delivery.status === "succeeded" && delivery.waiting_for === null)).toBe(true);
	});

	it("lets the next status go at once when the head's retries are spent and it ends failed", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const order = newOrderId();
		const base = freshBase();
		const answers = answering(webhook, label => (label === "X1" ? FAIL : OK));
		const x1 = statusOf(alice, order, "X1", "committed", base);
		const x2 = statusOf(alice, order, "X2", "staged", base + 1_000);
		await publish(x1);
		await publish(x2);
		const head = await rowOf(x1.event_id!, webhook);
		const next = await rowOf(x2.event_id!, webhook);
		await expectWaitingFor(webhook, alice.token, next.id, head.id);

		const done = await rowWhen(x2.event_id!, webhook, row => row.status === "succeeded", "X2 to be delivered");
		expect(done.attempt_count).toBe(1);
		expect(await rowOf(x1.event_id!, webhook)).toMatchObject({ status: "failed", attempt_count: 4 });
		// Every attempt of X1 (the first and three retries) came before X2.
		expect(answers.map(answer => `${answer.label}:${answer.status}`)).toEqual(["X1:500", "X1:500", "X1:500", "X1:500", "X2:200"]);
		expectEachOnce(answers, ["X2"]);
	});

	it("delivers at once an event older than one already delivered for its order", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const order = newOrderId();
		const base = freshBase();
		const answers = answering(webhook);
		const later = statusOf(alice, order, "LATER", "fulfilled", base + 5_000);
		await publish(later);
		await rowWhen(later.event_id!, webhook, row => row.status === "succeeded", "the later status to be delivered");

		const older = statusOf(alice, order, "OLDER", "in progress", base);
		await publish(older);
		const row = await rowOf(older.event_id!, webhook);
		// Its queue was empty: it went in as the head, due, waiting for nothing.
		expect(isTrue(row.waiting)).toBe(false);
		expect(row.order_key).toBe(order);
		expect((await shown(webhook, alice.token, row.id)).waiting_for).toBeNull();
		await rowWhen(older.event_id!, webhook, found => found.status === "succeeded", "the older status to be delivered");
		expect(delivered(answers)).toEqual(["LATER", "OLDER"]);
		expectEachOnce(answers, ["LATER", "OLDER"]);
	});

	it("delivers statuses taken in together in occurred_at order, whatever order they were published in", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const order = newOrderId();
		const base = freshBase();
		// The receiver holds its answers until the rows are read: on a busy machine the head was
		// once delivered, and the next status promoted, before this test looked.
		let rowsRead!: () => void;
		const untilRowsRead = new Promise<void>(resolve => (rowsRead = resolve));
		const answers = answering(webhook, () => untilRowsRead.then(() => OK));
		const labels = ["S1", "S2", "S3", "S4", "S5"];
		const statuses = ["committed", "staged", "in progress", "fulfilled", "expired"] as const;
		const events = labels.map((label, i) => statusOf(alice, order, label, statuses[i], base + i * 1_000));
		// All at once, the last to happen first.
		const results = await Promise.all([...events].reverse().map(publish));
		expect(results.every(result => result.deliveries === 1 && !result.duplicate)).toBe(true);
		const rows = await db()("deliveries").where({ webhook_id: webhook.id });
		rowsRead();
		// One intake batch (its rows share the batch's write time; 80 of 80 runs on a quiet
		// dispatcher took them in together), which wrote the earliest as the head.
		expect(new Set(rows.map(row => row.created_at)).size).toBe(1);
		expect(rows.filter(row => !isTrue(row.waiting)).map(row => row.event_id)).toEqual([events[0].event_id]);

		await waitUntil(() => delivered(answers).length, count => count === labels.length, "every status");
		expect(delivered(answers, order)).toEqual(labels);
		expectEachOnce(answers, labels);
	});

	it("sends a waiting delivery retried by hand at once, and recovered failed deliveries at once even behind a pending head", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const order = newOrderId();
		const base = freshBase();
		let recovered = false;
		// R1 fails until R3, retried by hand, has arrived; R2 stays behind it.
		const answers = answering(webhook, label => {
			if (label === "R1") return hasDelivered(answers, "R3") ? OK : FAIL;
			// F1 fails for good, until it is recovered; F2, the head after it, fails until F1 arrived.
			if (label === "F1") return recovered ? OK : FAIL;
			if (label === "F2") return hasDelivered(answers, "F1") ? OK : FAIL;
			return OK;
		});
		const r1 = statusOf(alice, order, "R1", "committed", base);
		const r2 = statusOf(alice, order, "R2", "staged", base + 1_000);
		const r3 = statusOf(alice, order, "R3", "in progress", base + 2_000);
		for (const event of [r1, r2, r3]) await publish(event);
		const head = await rowOf(r1.event_id!, webhook);
		const third = await rowOf(r3.event_id!, webhook);
		await expectWaitingFor(webhook, alice.token, third.id, head.id);

		const retried = await env.stack.request("POST", `/id/v3/webhooks/${webhook.id}/deliveries/${third.id}/retry`, { token: alice.token });
		expect(retried.status).toBe(202);
		expect(retried.body).toMatchObject({ id: third.id, status: "pending", waiting_for: null });
		await rowWhen(r3.event_id!, webhook, row => row.status === "succeeded", "R3 to be delivered");
		// It left its queue; R2 still waits for R1, which was pending when R3 went.
		expect(await rowOf(r3.event_id!, webhook)).toMatchObject({ order_key: null, attempt_count: 1 });
		await rowWhen(r2.event_id!, webhook, row => row.status === "succeeded", "R2 to be delivered after R1");
		expect(delivered(answers, order)).toEqual(["R3", "R1", "R2"]);
		expectEachOnce(answers, ["R1", "R2", "R3"]);

		// recover: F1 failed for good, and F2, its order's next, is the pending head now.
		const failedOrder = newOrderId();
		const since = new Date().toISOString();
		const f1 = statusOf(alice, failedOrder, "F1", "committed", base);
		const f2 = statusOf(alice, failedOrder, "F2", "staged", base + 1_000);
		await publish(f1);
		await publish(f2);
		await rowWhen(f1.event_id!, webhook, row => row.status === "failed", "F1 to fail");
		const f2Head = await rowWhen(f2.event_id!, webhook, row => row.attempt_count >= 1, "F2's first attempt");
		expect(f2Head.status).toBe("pending");
		recovered = true;
		const recover = await env.stack.request("POST", `/id/v3/webhooks/${webhook.id}/recover`, { token: alice.token, body: { since } });
		expect(recover.status).toBe(202);
		expect(recover.body).toEqual({ scheduled: 1, remaining: 0 });
		await rowWhen(f2.event_id!, webhook, row => row.status === "succeeded", "F2 to be delivered");
		// F1 went while F2 still failed: F2 succeeds only once F1 arrived.
		expect(await rowOf(f1.event_id!, webhook)).toMatchObject({ status: "succeeded", order_key: null });
		expect(delivered(answers, failedOrder)).toEqual(["F1", "F2"]);
		expect(answers.filter(answer => answer.label === "F2" && answer.status === 500).length).toBeGreaterThanOrEqual(1);
		expectEachOnce(answers, ["F1", "F2"]);
	});

	it("keeps a head retried by hand at the head of its queue: the statuses behind it still wait for it", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const order = newOrderId();
		const base = freshBase();
		// K1 fails its first attempt and the one asked for by hand; its next scheduled retry succeeds.
		const answers = answering(webhook, (label, attempt) => (label === "K1" && attempt <= 2 ? FAIL : OK));
		const k1 = statusOf(alice, order, "K1", "committed", base);
		const k2 = statusOf(alice, order, "K2", "staged", base + 1_000);
		await publish(k1);
		await publish(k2);
		const head = await rowWhen(k1.event_id!, webhook, row => row.attempt_count === 1 && row.lease_id === null, "K1's first attempt");
		const second = await rowOf(k2.event_id!, webhook);

		const retried = await env.stack.request("POST", `/id/v3/webhooks/${webhook.id}/deliveries/${head.id}/retry`, { token: alice.token });
		expect(retried.status).toBe(202);
		await rowWhen(k1.event_id!, webhook, row => row.attempt_count === 2 && row.lease_id === null, "K1's attempt asked for by hand");
		// K1 is still pending: K2 waits for it, and a later status waits behind both.
		await expectWaitingFor(webhook, alice.token, second.id, head.id);
		const k3 = statusOf(alice, order, "K3", "in progress", base + 2_000);
		await publish(k3);
		const third = await rowOf(k3.event_id!, webhook);
		expect(isTrue(third.waiting)).toBe(true);
		await expectWaitingFor(webhook, alice.token, third.id, head.id);

		await rowWhen(k3.event_id!, webhook, row => row.status === "succeeded", "K3 to be delivered");
		expect(answers.map(answer => `${answer.label}:${answer.status}`)).toEqual(["K1:500", "K1:500", "K1:200", "K2:200", "K3:200"]);
		expectEachOnce(answers, ["K1", "K2", "K3"]);
	});

	it("parks the head on 410 and keeps the rest waiting, unattempted; enabling the webhook delivers the head, then the rest in order", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const order = newOrderId();
		const base = freshBase();
		let gone = true;
		// G1's first attempt is held until G2 and G3 were taken in behind it.
		let takenIn!: () => void;
		const restTakenIn = new Promise<void>(resolve => (takenIn = resolve));
		const answers = answering(webhook, async () => {
			await restTakenIn;
			return gone ? { status: 410 } : OK;
		});
		const events = ["G1", "G2", "G3"].map((label, i) => statusOf(alice, order, label, (["committed", "staged", "fulfilled"] as const)[i], base + i * 1_000));
		for (const event of events) await publish(event);
		takenIn();

		const disabled = await waitUntil(
			async () => (await env.stack.request("GET", `/id/v3/webhooks/${webhook.id}`, { token: alice.token })).body,
			body => body.active === false,
			"the webhook to be disabled",
		);
		expect(disabled).toMatchObject({ active: false, disabled_reason: "gone" });
		// The disable parks G1 while its attempt's result may still be on its way to the database
		// (the result is written in a batch, the disable is not): wait for both.
		const head = await rowWhen(events[0].event_id!, webhook, row => isTrue(row.parked) && row.attempt_count === 1, "G1 to be parked with its attempt written");
		expect(head).toMatchObject({ status: "pending", attempt_count: 1, next_attempt_at: null, last_status_code: 410 });

		// Past a sweep and a re-check of parked deliveries: the rest still wait, not attempted, not parked.
		await aSweepLater();
		for (const event of events.slice(1)) {
			const row = await rowOf(event.event_id!, webhook);
			expect(row).toMatchObject({ status: "pending", attempt_count: 0, next_attempt_at: null, order_key: order });
			expect(isTrue(row.waiting)).toBe(true);
			expect(isTrue(row.parked)).toBe(false);
			await expectWaitingFor(webhook, alice.token, row.id, head.id);
		}
		expect(answers.map(answer => `${answer.label}:${answer.status}`)).toEqual(["G1:410"]);

		gone = false;
		const enabled = await patch(webhook, alice.token, { active: true });
		expect(enabled.body).toMatchObject({ active: true, disabled_reason: null });
		await rowWhen(events[2].event_id!, webhook, row => row.status === "succeeded", "G3 to be delivered");
		expect(answers.map(answer => `${answer.label}:${answer.status}`)).toEqual(["G1:410", "G1:200", "G2:200", "G3:200"]);
		expectEachOnce(answers, ["G1", "G2", "G3"]);
	});

	it("cancels the head and the waiting deliveries when the webhook is deleted; nothing more arrives", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const order = newOrderId();
		const base = freshBase();
		const answers = answering(webhook, () => FAIL);
		const events = ["D1", "D2", "D3"].map((label, i) => statusOf(alice, order, label, (["committed", "staged", "fulfilled"] as const)[i], base + i * 1_000));
		for (const event of events) await publish(event);
		// Between D1's first attempt and its retry.
		await rowWhen(events[0].event_id!, webhook, row => row.attempt_count === 1 && row.lease_id === null, "D1's first attempt");

		expect((await env.stack.request("DELETE", `/id/v3/webhooks/${webhook.id}`, { token: alice.token })).status).toBe(204);
		for (const event of events) await rowWhen(event.event_id!, webhook, row => row.status === "cancelled", "the delivery to be cancelled");
		const rows = await db()("deliveries").where({ webhook_id: webhook.id });
		expect(rows.map(row => [row.status, row.next_attempt_at]).sort()).toEqual([
			["cancelled", null],
			["cancelled", null],
			["cancelled", null],
		]);
		// Past D1's retry time and a sweep: nothing more was sent.
		await aSweepLater();
		expect(answers.map(answer => `${answer.label}:${answer.status}`)).toEqual(["D1:500"]);
		expect((await db()("deliveries").where({ webhook_id: webhook.id })).every(row => row.status === "cancelled")).toBe(true);
	});

	it("never queues a repeated event_id twice: one delivery, one receipt", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const order = newOrderId();
		const base = freshBase();
		let repeated = false;
		const answers = answering(webhook, (label, attempt) => (label === "E1" && (attempt === 1 || !repeated) ? FAIL : OK));
		const e1 = statusOf(alice, order, "E1", "committed", base);
		const e2 = statusOf(alice, order, "E2", "staged", base + 1_000);
		await publish(e1);
		await publish(e2);
		// Repeats of the waiting one and of the head, by publish and by the broker event, at once.
		const again = await Promise.all([publish(e2), publish({ ...e2, status: "failed" }), publish(e1)]);
		env.stack.app.broker.emit("tasking.order_status", e2);
		env.stack.app.broker.emit("tasking.order_status", e1);
		expect(again.map(answer => [answer.duplicate, answer.deliveries])).toEqual([
			[true, 0],
			[true, 0],
			[true, 0],
		]);
		repeated = true;
		await rowWhen(e2.event_id!, webhook, row => row.status === "succeeded", "E2 to be delivered");
		await aSweepLater();
		for (const event of [e1, e2]) expect(await db()("deliveries").where({ event_id: event.event_id })).toHaveLength(1);
		expect(delivered(answers)).toEqual(["E1", "E2"]);
		expectEachOnce(answers, ["E1", "E2"]);
		expect(verified(env.received(webhook).at(-1)!, webhook.secret)).toMatchObject({ data: { status: "staged" } });
	});

	it("does not order test sends and webhook:disabled notices: they go while an order's head is failing", async () => {
		const alice = await newCustomer(env.stack);
		const watcher = await env.createWebhook(alice.token, { events: ["tasking:order_status", "webhook:disabled"] });
		const doomed = await env.createWebhook(alice.token);
		const order = newOrderId();
		const base = freshBase();
		const doomedAnswers = answering(doomed, () => ({ status: 410 }));
		// The watcher's head fails until the test send and the notice have arrived.
		const answers = answering(watcher, label => {
			if (label !== "N1") return OK;
			return hasDelivered(answers, "webhook:test") && hasDelivered(answers, "webhook:disabled") ? OK : FAIL;
		});
		const n1 = statusOf(alice, order, "N1", "committed", base);
		const n2 = statusOf(alice, order, "N2", "staged", base + 1_000);
		await publish(n1);
		await publish(n2);
		const head = await rowOf(n1.event_id!, watcher);
		const waiting = await rowOf(n2.event_id!, watcher);
		expect(isTrue(waiting.waiting)).toBe(true);

		const tested = await env.stack.request("POST", `/id/v3/webhooks/${watcher.id}/test`, { token: alice.token });
		expect(tested.status).toBe(200);
		expect(tested.body).toMatchObject({ success: true, status_code: 200 });
		// Not persisted: no message, no delivery of it.
		const types = await db()("deliveries as d").join("delivery_messages as m", "m.event_id", "d.event_id").where({ "d.webhook_id": watcher.id }).pluck("m.type");
		expect(types.filter(type => type !== "webhook:disabled").sort()).toEqual(["tasking:order_status", "tasking:order_status"]);
		expect(await db()("delivery_messages").where({ type: "webhook:test" })).toHaveLength(0);
		expect(head.order_key).toBe(order);

		// The other webhook's 410 disables it; the watcher hears of it while its own head still fails.
		await rowWhen(n2.event_id!, watcher, row => row.status === "succeeded", "N2 to be delivered");
		expect(doomedAnswers.map(answer => `${answer.label}:${answer.status}`)).toEqual(["N1:410"]);
		const notices = await db()("deliveries as d").join("delivery_messages as m", "m.event_id", "d.event_id").where({ "d.webhook_id": watcher.id, "m.type": "webhook:disabled" }).select("d.*");
		expect(notices).toHaveLength(1);
		expect(notices[0]).toMatchObject({ order_key: null, status: "succeeded", attempt_count: 1 });
		expect(isTrue(notices[0].waiting)).toBe(false);
		// Both went while N1 was failing, N2 after N1.
		expect(delivered(answers).slice(2)).toEqual(["N1", "N2"]);
		expect(delivered(answers).slice(0, 2).sort()).toEqual(["webhook:disabled", "webhook:test"]);
		expect(delivered(answers, order)).toEqual(["N1", "N2"]);
		expectEachOnce(answers, ["webhook:test", "webhook:disabled", "N1", "N2"]);
	});

	it('releases the waiting deliveries at once when ordering becomes "none", and later statuses do not wait', async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const order = newOrderId();
		const base = freshBase();
		// The head fails until the released ones and a later status have arrived.
		const answers = answering(webhook, label => (label !== "O1" ? OK : ["O2", "O3", "O4"].every(other => hasDelivered(answers, other)) ? OK : FAIL));
		const events = ["O1", "O2", "O3"].map((label, i) => statusOf(alice, order, label, (["committed", "staged", "in progress"] as const)[i], base + i * 1_000));
		for (const event of events) await publish(event);
		const head = await rowWhen(events[0].event_id!, webhook, row => row.attempt_count === 1, "O1's first attempt");
		expect(isTrue((await rowOf(events[2].event_id!, webhook)).waiting)).toBe(true);

		const patched = await patch(webhook, alice.token, { ordering: "none" });
		expect(patched.status).toBe(200);
		expect(patched.body.ordering).toBe("none");
		for (const event of events.slice(1)) await rowWhen(event.event_id!, webhook, row => row.status === "succeeded", "a released status to be delivered");
		for (const event of events) {
			const row = await rowOf(event.event_id!, webhook);
			expect(row.order_key).toBeNull();
			expect(isTrue(row.waiting)).toBe(false);
		}
		expect((await rowOf(head.event_id, webhook)).status).toBe("pending");

		const o4 = statusOf(alice, order, "O4", "fulfilled", base + 3_000);
		await publish(o4);
		const fresh = await rowOf(o4.event_id!, webhook);
		expect(fresh.order_key).toBeNull();
		expect(isTrue(fresh.waiting)).toBe(false);
		await rowWhen(events[0].event_id!, webhook, row => row.status === "succeeded", "O1 to be delivered in the end");
		// O2, O3 and O4 came while O1 still failed.
		expect(delivered(answers)).toEqual(["O2", "O3", "O4", "O1"]);
		expectEachOnce(answers, ["O1", "O2", "O3", "O4"]);
	});

	it('never queues for a webhook created with ordering "none"', async () => {
		const alice = await newCustomer(env.stack);
		const created = await env.stack.request("POST", "/id/v3/webhooks", {
			token: alice.token,
			body: { name: "unordered", url: `${env.receiver.url}/unordered/${crypto.randomUUID()}`, events: ["tasking:order_status"], ordering: "none" },
		});
		expect(created.status).toBe(201);
		expect(created.body.ordering).toBe("none");
		const webhook: CreatedWebhook = { id: created.body.id, secret: created.body.secret, url: created.body.url, path: new URL(created.body.url).pathname };
		const order = newOrderId();
		const base = freshBase();
		const answers = answering(webhook, label => (label !== "U1" ? OK : hasDelivered(answers, "U2") && hasDelivered(answers, "U3") ? OK : FAIL));
		const events = ["U1", "U2", "U3"].map((label, i) => statusOf(alice, order, label, (["committed", "staged", "in progress"] as const)[i], base + i * 1_000));
		await publish(events[0]);
		await rowWhen(events[0].event_id!, webhook, row => row.attempt_count === 1, "U1's first attempt");
		for (const event of events.slice(1)) await publish(event);
		for (const event of events) {
			const row = await rowOf(event.event_id!, webhook);
			expect(row.order_key).toBeNull();
			expect(isTrue(row.waiting)).toBe(false);
		}
		await rowWhen(events[0].event_id!, webhook, row => row.status === "succeeded", "U1 to be delivered");
		expect(delivered(answers)).toEqual(["U2", "U3", "U1"]);
		expectEachOnce(answers, ["U1", "U2", "U3"]);
	});

	it("promotes the next status of a queue left without a head at its next sweep", async () => {
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		const order = newOrderId();
		const base = freshBase();
		const answers = answering(webhook, label => (label === "H1" ? FAIL : OK));
		const h1 = statusOf(alice, order, "H1", "committed", base);
		const h2 = statusOf(alice, order, "H2", "staged", base + 1_000);
		await publish(h1);
		await publish(h2);
		await rowWhen(h1.event_id!, webhook, row => row.attempt_count === 1 && row.lease_id === null, "H1's first attempt");
		// As if an instance had died between two commits: the head ended, its next was not promoted.
		const polled = dispatcher().polls;
		const ended = await db()("deliveries")
			.where({ event_id: h1.event_id, webhook_id: webhook.id, status: "pending", attempt_count: 1 })
			.whereNull("lease_id")
			.update({ status: "succeeded", next_attempt_at: null });
		expect(ended).toBe(1);
		await rowWhen(h2.event_id!, webhook, row => !isTrue(row.waiting), "H2 to be promoted");
		// Within the sweep's cadence: the first sweep after the head ended (a poll or two more may
		// pass before this test reads the row).
		expect(dispatcher().polls - polled).toBeLessThanOrEqual(PARKED_RECHECK_POLLS + 2);
		await rowWhen(h2.event_id!, webhook, row => row.status === "succeeded", "H2 to be delivered");
		expect(answers.map(answer => `${answer.label}:${answer.status}`)).toEqual(["H1:500", "H2:200"]);
	});
});
