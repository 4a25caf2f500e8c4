// The HTTP intake in the embedded mode, on both engines: POST /id/v3/events/tasking.order_status
// from a token with the scope events:publish. What is answered 202 is stored (deliveries counted
// at a real HTTPS receiver, the email written to the mail folder), a repeat is delivered once, a
// customer's token gets 403, a bad list gets 422 naming index and field with nothing stored, the
// body limit and the rate limit hold, and PostgreSQL cut off gets 503 with nothing stored.
// The cluster mode (JetStream, NATS down, a dispatcher SIGKILLed) is cluster-http-intake.test.ts.
import { spawn } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { newCustomer, orderEvent, startDeliveryStack, verified, waitUntil, type CreatedWebhook, type DeliveryStack, type TestCustomer } from "./helpers/delivery-stack";
import { expectProblem, rejectionCheck, snapshotTables, startStack, type Stack } from "./helpers/stack";
import { describeWhere, TEST_DATABASE_URL, testDatabases } from "./helpers/services";
import { startTcpRelay, type TcpRelay } from "./helpers/tcp-relay";

const INTAKE = "/id/v3/events/tasking.order_status";
const ROOT = path.resolve(__dirname, "..");
// Every table an event can reach, in the dispatcher's and in the notifier's hands.
const EVENT_TABLES = ["delivery_messages", "deliveries", "delivery_rejected_events", "email_outbox", "email_rejected_events"];

async function optInToEmail(stack: Stack, token: string): Promise<void> {
	const response = await stack.request("PUT", "/id/v3/user/settings", { token, body: { notifications: [{ category: "tasking", settings: [{ topic: "tasking:order_status", email: true }] }] } });
	expect(response.status).toBe(200);
}

/** The .eml files the embedded notifier wrote, as text. */
function emails(stack: Stack): string[] {
	const dir = path.join(stack.dataDir, "mail");
	if (!fs.existsSync(dir)) return [];
	return fs
		.readdirSync(dir)
		.filter(name => name.endsWith(".eml"))
		.map(name => fs.readFileSync(path.join(dir, name), "utf8"));
}

/** Waits until no delivery and no email is pending, so that a table snapshot stays still. */
async function settled(stack: Stack): Promise<void> {
	const pending = async () => (await stack.db("deliveries").where({ status: "pending" })).length + (await stack.db("email_outbox").where({ status: "pending" })).length;
	await waitUntil(pending, count => count === 0, "every delivery and email to settle");
}

/** How many verified deliveries of each order reached the webhook. */
function deliveriesByOrder(env: DeliveryStack, webhook: CreatedWebhook): Map<string, number> {
	const counts = new Map<string, number>();
	for (const request of env.received(webhook)) {
		const orderId = String(verified(request, webhook.secret).data.order_id);
		counts.set(orderId, (counts.get(orderId) ?? 0) + 1);
	}
	return counts;
}

describe.each(testDatabases())("HTTP intake, embedded (%s)", database => {
	let env: DeliveryStack;
	let producer: string;
	let customer: TestCustomer;
	let webhook: CreatedWebhook;
	const statuses: number[] = [];
	const rejected = rejectionCheck(() => env.stack, EVENT_TABLES, statuses);

	beforeAll(async () => {
		env = await startDeliveryStack(database, { env: { MAIL_POLL_INTERVAL: "100ms" } });
		producer = await env.stack.token("orders-service", { scope: "events:publish" });
		customer = await newCustomer(env.stack, { signIn: true });
		await optInToEmail(env.stack, customer.token);
		webhook = await env.createWebhook(customer.token);
	});
	afterAll(() => env?.stop());

	it("stores a list, answers its event_ids in order, and delivers every event and the email", async () => {
		const given = crypto.randomUUID().toUpperCase();
		const events = [
			orderEvent(customer, { event_id: given, status: "Fulfilled" }),
			{ ...orderEvent(customer, { status: "in progress" }), event_id: undefined },
			// No customer_id: the customer of the user, as the consumers would look it up.
			{ ...orderEvent(customer, { status: "staged" }), customer_id: undefined },
		];
		const response = await env.stack.request("POST", INTAKE, { token: producer, body: events });
		expect(response.status).toBe(202);
		const ids: string[] = response.body.event_ids;
		expect(ids).toHaveLength(3);
		expect(ids[0]).toBe(given.toLowerCase());
		expect(ids[1]).not.toBe(ids[2]);
		// 202 means committed: the rows are there before anything is waited for.
		const stored = await env.stack.db("delivery_messages").whereIn("event_id", ids).select("event_id", "customer_id");
		expect(stored.map(row => row.event_id).sort()).toEqual([...ids].sort());
		expect(new Set(stored.map(row => row.customer_id))).toEqual(new Set([customer.id]));
		const outbox = await env.stack.db("email_outbox").whereIn("event_id", ids).select("event_id", "order_id");
		expect(outbox).toEqual([{ event_id: ids[0], order_id: events[0].order_id }]);

		const counts = await waitUntil(
			() => deliveriesByOrder(env, webhook),
			found => events.every(event => found.has(event.order_id)),
			"three verified deliveries",
		);
		expect(events.map(event => counts.get(event.order_id))).toEqual([1, 1, 1]);
		const [email] = await waitUntil(
			() => emails(env.stack).filter(text => text.includes(events[0].order_id)),
			found => found.length > 0,
			"the email in the mail folder",
		);
		expect(email).toContain(`To: ${customer.userId}@example.com`);
		await settled(env.stack);
	});

	it("takes a single event, and answers a repeated event_id 202 without storing it twice", async () => {
		const event = orderEvent(customer, { status: "expired" });
		const first = await env.stack.request("POST", INTAKE, { token: producer, body: event });
		expect({ status: first.status, body: first.body }).toEqual({ status: 202, body: { event_ids: [event.event_id] } });
		const again = await env.stack.request("POST", INTAKE, { token: producer, body: [event, event] });
		expect({ status: again.status, body: again.body }).toEqual({ status: 202, body: { event_ids: [event.event_id, event.event_id] } });
		expect(await env.stack.db("deliveries").where({ event_id: event.event_id })).toHaveLength(1);
		expect(await env.stack.db("email_outbox").where({ event_id: event.event_id })).toHaveLength(1);
		await waitUntil(() => deliveriesByOrder(env, webhook).get(event.order_id), count => count === 1, "the delivery");
		await settled(env.stack);
	});

	it("answers 403 to a customer's token, and to a token with other scopes, storing nothing", async () => {
		const event = orderEvent(customer);
		const refused = await rejected("POST", INTAKE, { token: customer.token, body: event }, 403);
		expect(refused.body.detail).toContain("events:publish");
		const otherScopes = await env.stack.token("reporting", { scope: "webhooks:read events:read" });
		await rejected("POST", INTAKE, { token: otherScopes, body: event }, 403);
		// Refused before the body is read: a customer learns nothing about what would be accepted.
		await rejected("POST", INTAKE, { token: customer.token, body: "{not json", headers: { "content-type": "application/json" } }, 403);
		await rejected("POST", INTAKE, { body: event }, 401);
	});

	it("answers 422 for the whole list when any event is bad, naming index and field, and stores nothing", async () => {
		const good = orderEvent(customer);
		const response = await rejected(
			"POST",
			INTAKE,
			{ token: producer, body: [good, { ...orderEvent(customer), status: "lost" }, { ...orderEvent(customer), order_id: undefined, event_id: "42" }, "text"] },
			422,
		);
		expect(response.body.errors).toEqual([
			{ path: "[1].status", message: expect.stringContaining("must be one of") },
			{ path: "[2].event_id", message: "must be a UUID" },
			{ path: "[2].order_id", message: expect.any(String) },
			{ path: "[3]", message: "must be an event object" },
		]);
		const single = await rejected("POST", INTAKE, { token: producer, body: { ...good, occurred_at: "yesterday" } }, 422);
		expect(single.body.errors).toEqual([{ path: "occurred_at", message: "must be an ISO 8601 timestamp" }]);
		const stranger = await rejected("POST", INTAKE, { token: producer, body: [good, { ...orderEvent(customer), customer_id: undefined, user_id: "nobody-knows-me" }] }, 422);
		expect(stranger.body.errors).toEqual([{ path: "[1].user_id", message: "is not a known user, and no customer_id was given" }]);
		const tooMany = await rejected("POST", INTAKE, { token: producer, body: Array.from({ length: 101 }, () => ({ ...good, event_id: crypto.randomUUID() })) }, 422);
		expect(tooMany.body.errors).toEqual([{ path: "", message: "holds 101 events: send at most 100 per request" }]);
		await rejected("POST", INTAKE, { token: producer, body: [] }, 422);
		await rejected("POST", INTAKE, { token: producer }, 422);
		await rejected("POST", INTAKE, { token: producer, body: "[1,", headers: { "content-type": "application/json" } }, 400);
		await rejected("POST", INTAKE, { token: producer, body: JSON.stringify(good), headers: { "content-type": "text/plain" } }, 415);
		await rejected("POST", `${INTAKE}?customer_id=other`, { token: producer, body: good }, 422);
		expect(await env.stack.db("delivery_messages").where({ event_id: good.event_id })).toHaveLength(0);
	});

	it("works with a trailing slash; another method gets 405 and another topic 404", async () => {
		const event = orderEvent(customer, { status: "staged" });
		const slash = await env.stack.request("POST", `${INTAKE}/`, { token: producer, body: event });
		expect({ status: slash.status, body: slash.body }).toEqual({ status: 202, body: { event_ids: [event.event_id] } });
		await settled(env.stack);
		const wrongMethod = await rejected("GET", INTAKE, { token: producer }, 405);
		expect(wrongMethod.headers.get("allow")).toContain("POST");
		await rejected("POST", "/id/v3/events/tasking.order_cancelled", { token: producer, body: event }, 404);
	});

	it("keeps the 64 KiB body limit", async () => {
		const padded = Array.from({ length: 5 }, () => orderEvent(customer, { details: { note: "x".repeat(14_000) } }));
		await rejected("POST", INTAKE, { token: producer, body: padded }, 413);
	});

	it("is in the rate limit of its principal", async () => {
		const response = await env.stack.request("POST", INTAKE, { token: producer, body: orderEvent(customer, { status: "staged" }) });
		expect(response.status).toBe(202);
		expect(Number(response.headers.get("ratelimit-limit"))).toBe(env.stack.config.RATE_LIMIT_PER_MINUTE);
		expect(Number(response.headers.get("ratelimit-remaining"))).toBeLessThan(env.stack.config.RATE_LIMIT_PER_MINUTE);
	});

	it("never answered a 5xx to a bad request", () => {
		expect(statuses.filter(status => status >= 500)).toEqual([]);
	});
});

describe("HTTP intake at its rate limit", () => {
	let stack: Stack;
	beforeAll(async () => {
		stack = await startStack({ env: { RATE_LIMIT_PER_MINUTE: "2" } });
	});
	afterAll(() => stack?.stop());

	it("answers 429 with Retry-After past the limit, and stores nothing", async () => {
		const token = await stack.token("limited-producer", { scope: "events:publish" });
		const event = (n: number) => ({ event_id: crypto.randomUUID(), customer_id: "limited-co", user_id: "limited-user", order_id: `o-${n}`, status: "staged" });
		for (const n of [1, 2]) expect((await stack.request("POST", INTAKE, { token, body: event(n) })).status).toBe(202);
		const before = await snapshotTables(stack.db, EVENT_TABLES);
		const limited = await stack.request("POST", INTAKE, { token, body: event(3) });
		expectProblem(limited, 429);
		expect(Number(limited.headers.get("retry-after"))).toBeGreaterThan(0);
		expect(await snapshotTables(stack.db, EVENT_TABLES)).toEqual(before);
	});
});

const describePostgres = describeWhere({ postgres: true });

describePostgres("HTTP intake, embedded, PostgreSQL cut off", () => {
	let relay: TcpRelay;
	let env: DeliveryStack;

	beforeAll(async () => {
		const target = new URL(TEST_DATABASE_URL);
		relay = await startTcpRelay({ host: target.hostname, port: Number(target.port || 5432) });
		const throughRelay = new URL(TEST_DATABASE_URL);
		throughRelay.hostname = "127.0.0.1";
		throughRelay.port = String(relay.port);
		env = await startDeliveryStack("postgres", { env: { DATABASE_URL: throughRelay.toString() } });
	});
	afterAll(async () => {
		await env?.stop();
		await relay?.close();
	});

	it("answers 503 while the database is unreachable, stores nothing, and 202 for the same request once it is back", async () => {
		const producer = await env.stack.token("orders-service", { scope: "events:publish" });
		const customer = await newCustomer(env.stack, { signIn: true });
		const webhook = await env.createWebhook(customer.token);
		const warmUp = orderEvent(customer);
		expect((await env.stack.request("POST", INTAKE, { token: producer, body: warmUp })).status).toBe(202);

		const events = Array.from({ length: 20 }, () => orderEvent(customer, { status: "fulfilled" }));
		const ids = events.map(event => event.event_id!);
		await relay.cut();
		const refused = await env.stack.request("POST", INTAKE, { token: producer, body: events });
		expectProblem(refused, 503);
		expect(refused.headers.get("retry-after")).toBeTruthy();
		// Read directly, not through the relay.
		for (const table of ["delivery_messages", "deliveries", "email_outbox"]) expect({ table, rows: await env.stack.db(table).whereIn("event_id", ids) }).toEqual({ table, rows: [] });

		await relay.restore();
		const accepted = await waitUntil(
			() => env.stack.request("POST", INTAKE, { token: producer, body: events }),
			response => response.status !== 503,
			"the database to be back",
		);
		expect({ status: accepted.status, body: accepted.body }).toEqual({ status: 202, body: { event_ids: ids } });
		const counts = await waitUntil(
			() => deliveriesByOrder(env, webhook),
			found => events.every(event => found.has(event.order_id)),
			"every delivery after the outage",
		);
		expect(events.filter(event => counts.get(event.order_id) !== 1)).toEqual([]);
	});
});

describe("the HTTP producer example of docs/delivery.md", () => {
	let stack: Stack;
	beforeAll(async () => {
		stack = await startStack();
	});
	afterAll(() => stack?.stop());

	it("runs as written and stores the events it posts", async () => {
		// alice wants the order-status email: the fulfilled event of the example records one.
		const alice = await stack.token("alice", { customer: "acme", email: "alice@example.com" });
		const settings = await stack.request("PUT", "/id/v3/user/settings", { token: alice, body: { notifications: [{ category: "tasking", settings: [{ topic: "tasking:order_status", email: true }] }] } });
		expect(settings.status).toBe(200);
		const doc = fs.readFileSync(path.join(ROOT, "docs", "delivery.md"), "utf8");
		const section = doc.split(/^#{2,4} /m).find(part => part.startsWith("Over HTTP, for producers outside the broker\n"));
		if (!section) throw new Error('docs/delivery.md has no "Over HTTP, for producers outside the broker" subsection');
		const script = [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map(match => match[1]).join("\n");
		expect(script).toContain("curl");
		const shellEnv = Object.fromEntries(Object.entries(process.env).filter(([name]) => !/^npm_/i.test(name)));
		const { code, stdout, stderr } = await new Promise<{ code: number | null; stdout: string; stderr: string }>(resolve => {
			const child = spawn("bash", ["-euo", "pipefail", "-c", script.replaceAll("http://localhost:3000", stack.baseUrl)], {
				cwd: ROOT,
				env: { ...shellEnv, DATA_DIR: stack.dataDir, AUTH_JWT_SECRET: "", AUTH_JWKS_URL: "", NODE_ENV: "" },
			});
			let out = "";
			let err = "";
			child.stdout.on("data", chunk => (out += chunk));
			child.stderr.on("data", chunk => (err += chunk));
			child.on("close", exitCode => resolve({ code: exitCode, stdout: out, stderr: err }));
		});
		expect({ code, stderr }).toEqual({ code: 0, stderr: "" });
		const answer = JSON.parse(stdout.trim().split("\n").at(-1)!);
		expect(answer.event_ids).toHaveLength(2);
		expect(answer.event_ids[0]).toBe("6f1d2c9e-4b7a-4c1e-9f3a-2d5e8b7c1a90");
		const stored = await stack.db("delivery_messages").whereIn("event_id", answer.event_ids).select("event_id");
		expect(stored).toHaveLength(2);
		const outbox = await stack.db("email_outbox").whereIn("event_id", answer.event_ids).select("order_id");
		expect(outbox).toEqual([{ order_id: "o-1" }]);
	}, 60_000);
});
