// Prometheus metrics on the ops endpoint, scraped from a real stack: the delivery backlog gauges
// (pending, due, age of the oldest due one), the email outbox by status and the age of its
// oldest pending email, HTTP requests by route template and status with their latency, beside
// the existing delivery and email counters, and the connections opened to receivers (against a
// receiver's own count, one closing them after each answer). Each is seen to move after real
// deliveries (one receiver slow, one failing) and real emails (a real SMTP server that first
// defers, then accepts). On SQLite and PostgreSQL: the gauges are read with SQL on either.
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import type http from "node:http";
import type { AddressInfo } from "node:net";
import { ServiceBroker } from "moleculer";
import { counterReadAtScrape } from "../lib/metrics";
import { LOOP_READING_MS } from "../lib/threaded-sender";
import { startOpsServer } from "../lib/ops-server";
import { WEBHOOK_LEASE_FACTOR } from "../mixins/dispatcher/shared";
import { testDatabases } from "./helpers/services";
import { pathOf, startHttpsReceiver } from "./helpers/https-receiver";
import { startSmtpServer, type TestSmtpServer } from "./helpers/smtp-server";
import { startDeliveryStack, waitUntil, type DeliveryStack, type OrderEvent } from "./helpers/delivery-stack";

/** `name{labels} value` lines of a Prometheus text page, as a lookup. */
function metricValue(page: string, name: string, labels: Record<string, string> = {}): number | undefined {
	for (const line of page.split("\n")) {
		const match = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
		if (!match || match[1] !== name) continue;
		const found = Object.fromEntries([...(match[2] ?? "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map(label => [label[1], label[2]]));
		if (Object.entries(labels).every(([key, value]) => found[key] === value)) return Number(match[3]);
	}
	return undefined;
}

describe.each(testDatabases())("metrics on %s", database => {
	let env: DeliveryStack;
	let smtp: TestSmtpServer;
	let ops: http.Server;
	let deferEmails = true;
	// Emails to these addresses are deferred (451) on every attempt.
	const deferredAddresses = new Set<string>();

	const scrape = async () => {
		const response = await fetch(`http://127.0.0.1:${(ops.address() as AddressInfo).port}/metrics`);
		expect(response.status).toBe(200);
		return response.text();
	};
	const watch = (what: string, check: (page: string) => boolean) => waitUntil(scrape, check, what);
	const customer = async (email?: string) => {
		const id = `cust-${crypto.randomBytes(4).toString("hex")}`;
		return { id, userId: `user-${id}`, token: await env.stack.token(`user-${id}`, { customer: id, ...(email ? { email } : {}) }) };
	};
	const orderEvent = (owner: { id: string; userId: string }, status: string): OrderEvent => ({
		event_id: crypto.randomUUID(),
		customer_id: owner.id,
		user_id: owner.userId,
		order_id: `o-${crypto.randomBytes(3).toString("hex")}`,
		status,
	});
	const publish = (owner: { id: string; userId: string }, status = "fulfilled") => env.stack.app.broker.call("dispatcher.publish", orderEvent(owner, status));
	// The event other services emit: the dispatcher and the notifier both consume it.
	const emitOrderEvent = (owner: { id: string; userId: string }, status: string) => env.stack.app.broker.emit("tasking.order_status", orderEvent(owner, status));

	beforeAll(async () => {
		smtp = await startSmtpServer({ answer: attempt => (deferEmails || attempt.to.some(address => deferredAddresses.has(address)) ? { code: 451, message: "4.3.0 try again later" } : "accept") });
		env = await startDeliveryStack(database, {
			env: {
				SMTP_URL: smtp.url,
				MAIL_POLL_INTERVAL: "100ms",
				// The shortest refresh: every wait below for a gauge to move waits out one interval.
				// FAST_DELIVERY_ENV's retries (1 s to 5 s) keep a failing delivery pending across a few.
				BACKLOG_REFRESH: "1s",
				MAIL_RETRY_SCHEDULE: "1s,2s,3s,4s,5s,6s,7s,8s,9s,10s",
				// One attempt at a time, so a webhook holds at most WEBHOOK_LEASE_FACTOR leases:
				// deliveries beyond those wait in the database, due.
				DELIVERY_CONCURRENCY: "1",
				DELIVERY_WEBHOOK_CONCURRENCY: "1",
			},
		});
		ops = await startOpsServer(env.stack.app.broker, 0, "127.0.0.1");
	});
	afterAll(async () => {
		await new Promise(resolve => ops?.close(resolve));
		await env?.stop();
		await smtp?.close();
	});

	it("publishes every gauge from the start, at zero", async () => {
		const page = await scrape();
		expect(metricValue(page, "webhook_deliveries_pending")).toBe(0);
		expect(metricValue(page, "webhook_deliveries_due")).toBe(0);
		expect(metricValue(page, "webhook_delivery_oldest_due_age_seconds")).toBe(0);
		for (const status of ["pending", "sent", "failed", "skipped"]) expect(metricValue(page, "email_outbox_emails", { status })).toBe(0);
		expect(metricValue(page, "email_outbox_oldest_pending_age_seconds")).toBe(0);
	});

	it("the delivery backlog: pending and due counts, and the oldest due delivery's age, rise and fall", async () => {
		const EVENTS = 2 * WEBHOOK_LEASE_FACTOR + 4;
		const owner = await customer();
		const slow = await env.createWebhook(owner.token);
		// WEBHOOK_LEASE_FACTOR are leased, the rest wait in the database, due, and age; claims take
		// them half a share at a time, each once the webhook is down to half its share. Sent one at
		// a time, the attempts keep rows due for about 3 s, past a few of the gauges' 1 s refreshes.
		env.script(slow, [], { status: 200, delayMs: Math.ceil(3_000 / (EVENTS - WEBHOOK_LEASE_FACTOR / 2 - 4)) });
		for (let i = 0; i < EVENTS; i++) await publish(owner);
		const backed = await watch("a due delivery waiting", page => (metricValue(page, "webhook_delivery_oldest_due_age_seconds") ?? 0) > 0);
		expect(metricValue(backed, "webhook_deliveries_pending")).toBeGreaterThanOrEqual(1);
		expect(metricValue(backed, "webhook_deliveries_due")).toBeGreaterThanOrEqual(1);
		const drained = await watch("the backlog to drain", page => metricValue(page, "webhook_deliveries_pending") === 0);
		expect(metricValue(drained, "webhook_deliveries_due")).toBe(0);
		expect(metricValue(drained, "webhook_delivery_oldest_due_age_seconds")).toBe(0);
		expect(metricValue(drained, "webhook_deliveries_finished_total", { status: "succeeded" })).toBeGreaterThanOrEqual(EVENTS);
		expect(metricValue(drained, "webhook_delivery_attempts_total", { result: "succeeded" })).toBeGreaterThanOrEqual(EVENTS);
	});

	it("failed attempts are counted and their deliveries stay pending until the schedule ends", async () => {
		const owner = await customer();
		const failing = await env.createWebhook(owner.token);
		env.script(failing, [], { status: 500 });
		await publish(owner);
		const page = await watch(
			"a failed attempt, its delivery pending a retry",
			current => (metricValue(current, "webhook_delivery_attempts_total", { result: "failed" }) ?? 0) >= 1 && (metricValue(current, "webhook_deliveries_pending") ?? 0) >= 1,
		);
		expect(metricValue(page, "webhook_delivery_attempt_seconds_count", { result: "failed" })).toBeGreaterThanOrEqual(1);
		await watch("the delivery to give up", current => (metricValue(current, "webhook_deliveries_finished_total", { status: "failed" }) ?? 0) >= 1);
	});

	it("the email outbox: a deferred email is pending and ages, then counts as sent; one its user no longer wants as skipped; an unwanted event as not queued", async () => {
		const reader = await customer("reader@example.com");
		const settings = { notifications: [{ category: "tasking", settings: [{ topic: "tasking:order_status", email: true }] }] };
		expect((await env.stack.request("PUT", "/id/v3/user/settings", { token: reader.token, body: settings })).status).toBe(200);
		await emitOrderEvent(reader, "fulfilled");
		const deferred = await watch(
			"a deferred email, pending and ageing",
			page => (metricValue(page, "email_send_attempts_total", { result: "retry" }) ?? 0) >= 1 && (metricValue(page, "email_outbox_oldest_pending_age_seconds") ?? 0) > 0,
		);
		expect(metricValue(deferred, "email_outbox_emails", { status: "pending" })).toBe(1);

		deferEmails = false;
		// The worker counts a finished email once its row's UPDATE has committed, so a scrape can fall
		// between the two: the gauge (a count of rows) may show it a moment before the counter.
		const finishedAs = (status: string) => (page: string) => metricValue(page, "email_outbox_emails", { status }) === 1 && metricValue(page, "emails_finished_total", { status }) !== undefined;
		const sent = await watch("the email sent", finishedAs("sent"));
		expect(metricValue(sent, "email_outbox_emails", { status: "pending" })).toBe(0);
		expect(metricValue(sent, "email_outbox_oldest_pending_age_seconds")).toBe(0);
		expect(metricValue(sent, "emails_finished_total", { status: "sent" })).toBe(1);

		// A user who turns email off while their email waits for a retry: skipped at the next attempt.
		const fickle = await customer("fickle@example.com");
		expect((await env.stack.request("PUT", "/id/v3/user/settings", { token: fickle.token, body: settings })).status).toBe(200);
		deferredAddresses.add("fickle@example.com");
		const retries = (page: string) => metricValue(page, "email_send_attempts_total", { result: "retry" }) ?? 0;
		const retriesBefore = retries(await scrape());
		await emitOrderEvent(fickle, "expired");
		await watch("the email deferred", page => retries(page) > retriesBefore);
		const off = { notifications: [{ category: "tasking", settings: [{ topic: "tasking:order_status", email: false }] }] };
		expect((await env.stack.request("PUT", "/id/v3/user/settings", { token: fickle.token, body: off })).status).toBe(200);
		const skipped = await watch("a skipped email", finishedAs("skipped"));
		expect(metricValue(skipped, "emails_finished_total", { status: "skipped" })).toBe(1);

		// A user who never turned email on: nothing is queued, and the event is counted as such.
		const quiet = await customer("quiet@example.com");
		await env.stack.request("GET", "/id/v3/user/details", { token: quiet.token });
		// The events of the other tests' customers, who never signed in, were not queued either.
		const notQueuedBefore = metricValue(await scrape(), "emails_not_queued_total", { reason: "email_off" }) ?? 0;
		await emitOrderEvent(quiet, "failed");
		const notQueued = await watch("an event not queued", page => (metricValue(page, "emails_not_queued_total", { reason: "email_off" }) ?? 0) > notQueuedBefore);
		expect(metricValue(notQueued, "email_outbox_emails", { status: "skipped" })).toBe(1);
	});

	it("a delivery's first attempt lag is observed once, not again for its retry; the sender thread's event loop is published", async () => {
		const before = await scrape();
		const lagCount = (page: string) => metricValue(page, "webhook_delivery_first_attempt_lag_seconds_count") ?? 0;
		const attempts = (page: string) => (metricValue(page, "webhook_delivery_attempts_total", { result: "succeeded" }) ?? 0) + (metricValue(page, "webhook_delivery_attempts_total", { result: "failed" }) ?? 0);
		const owner = await customer();
		const flaky = await env.createWebhook(owner.token);
		env.script(flaky, [{ status: 500 }], { status: 200 });
		await publish(owner);
		const after = await watch("the retry to succeed", page => (metricValue(page, "webhook_deliveries_finished_total", { status: "succeeded" }) ?? 0) > (metricValue(before, "webhook_deliveries_finished_total", { status: "succeeded" }) ?? 0));
		expect(env.received(flaky)).toHaveLength(2);
		expect(attempts(after) - attempts(before)).toBe(2);
		expect(lagCount(after) - lagCount(before)).toBe(1);
		expect(metricValue(after, "webhook_delivery_first_attempt_lag_seconds_bucket", { le: "+Inf" })).toBe(lagCount(after));
		expect(metricValue(after, "webhook_delivery_first_attempt_lag_seconds_sum")).toBeGreaterThanOrEqual(0);
		// The retry came due by the clock and was claimed: claims of due rows were timed.
		const claims = (page: string) => metricValue(page, "webhook_delivery_claim_seconds_count", { kind: "due" }) ?? 0;
		expect(claims(after)).toBeGreaterThan(claims(before));
		expect(metricValue(after, "webhook_delivery_claim_seconds_bucket", { kind: "due", le: "+Inf" })).toBe(claims(after));
		// The stack runs the default single sender thread, which sent both attempts.
		const utilization = metricValue(after, "webhook_sender_event_loop_utilization", { thread: "0" });
		expect(utilization).toBeGreaterThan(0);
		expect(utilization).toBeLessThanOrEqual(1);
		expect(metricValue(after, "webhook_sender_event_loop_delay_p99_seconds", { thread: "0" })).toBeGreaterThanOrEqual(0);
		expect(metricValue(after, "webhook_sender_event_loop_utilization", { thread: "1" })).toBeUndefined();
	});

	it("counts the connections opened to receivers: kept alive across attempts, or one per attempt to a receiver that closes them", async () => {
		// A receiver of this test's own, so that the other tests' retries to the stack's receiver
		// cannot add to its count; the dispatcher's counter takes in both receivers' connections.
		const own = await startHttpsReceiver({ respond: request => ({ status: 200, body: "ok", headers: pathOf(request) === "/closing" ? { connection: "close" } : undefined }) });
		try {
			const opened = (page: string) => metricValue(page, "webhook_connections_opened_total") ?? 0;
			const accepted = () => env.receiver.connections + own.connections;
			const deliverOneByOne = async (path: string) => {
				const owner = await customer();
				const created = await env.stack.request("POST", "/id/v3/webhooks", { token: owner.token, body: { name: path, url: own.url + path, events: ["tasking:order_status"] } });
				expect(created.status).toBe(201);
				// A scrape reuses the sender threads' reading for LOOP_READING_MS: one that reused a reading
				// from before the last test's retry counted the receivers' connection and not the sender's,
				// and the counts below never met (one run in five).
				await sleep(LOOP_READING_MS);
				const before = { page: await scrape(), accepted: accepted(), own: own.connections };
				for (let n = 1; n <= 3; n += 1) {
					await publish(owner);
					await waitUntil(() => own.requests.filter(request => pathOf(request) === path).length, received => received === n, `delivery ${n} to ${path}`);
				}
				// Once a scrape reads the sender thread after the last connection, the counter has
				// grown by what the receivers accepted.
				await watch("the counter to match the receivers", page => opened(page) - opened(before.page) === accepted() - before.accepted);
				return own.connections - before.own;
			};
			expect(await deliverOneByOne("/closing")).toBe(3);
			// One connection at most, kept alive for the other two.
			expect(await deliverOneByOne("/keeping")).toBeLessThanOrEqual(1);
		} finally {
			await own.close();
		}
	});

	it("HTTP requests by route template and status, with latency", async () => {
		const owner = await customer();
		await env.createWebhook(owner.token);
		await env.stack.request("GET", `/id/v3/webhooks/${crypto.randomUUID()}`, { token: owner.token });
		await env.stack.request("GET", `/id/v3/webhooks/${crypto.randomUUID()}/`, { token: owner.token });
		await env.stack.request("GET", "/no/such/path");
		const page = await scrape();
		expect(metricValue(page, "http_requests_total", { method: "POST", route: "/id/v3/webhooks", status: "201" })).toBeGreaterThanOrEqual(1);
		// Ids never become labels: both unknown ids count under the template.
		expect(metricValue(page, "http_requests_total", { method: "GET", route: "/id/v3/webhooks/:id", status: "404" })).toBe(2);
		expect(metricValue(page, "http_request_duration_seconds_count", { method: "GET", route: "/id/v3/webhooks/:id", status: "404" })).toBe(2);
		expect(metricValue(page, "http_request_duration_seconds_bucket", { method: "GET", route: "/id/v3/webhooks/:id", status: "404", le: "+Inf" })).toBe(2);
		expect(metricValue(page, "http_requests_total", { method: "GET", route: "unmatched", status: "404" })).toBeGreaterThanOrEqual(1);
		expect(page).not.toMatch(/route="\/id\/v3\/webhooks\/[0-9a-f]{8}-/);
	});
});

describe("a counter read at scrape time from sources that start over", () => {
	it("adds what each source added since the previous scrape, and counts a restarted source from zero, never going down", async () => {
		const broker = new ServiceBroker({ logger: false });
		// Two sender threads' counts at each scrape; the second is not running at the second scrape,
		// and restarted (a new thread, counting from zero) at the third.
		const readings: Array<Array<number | null>> = [
			[3, 5],
			[4, null],
			[6, 2],
		];
		const counter = counterReadAtScrape(broker, "test_connections_opened_total", "test", async () => readings.shift()!);
		const value = async () => (await counter.get()).values[0].value;
		expect(await value()).toBe(8);
		expect(await value()).toBe(9);
		expect(await value()).toBe(13);
	});
});
