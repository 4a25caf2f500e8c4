// The runnable examples in examples/, each run as a customer or another team runs it, against a
// real service: the HTTPS receiver (examples/receiver.mjs) verifying with the SDK's
// verifyWebhook, the HTTP producers (examples/http-producer.mjs with fetch, http-producer.sh with
// curl), and the Moleculer producer (examples/producer.mjs) on the durable JetStream channel of a
// cluster-mode service. The SDK is built first, as its package would be installed.
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { ServiceBroker } from "moleculer";
import { startStack, type Stack } from "./helpers/stack";
import { CommandProcess } from "./helpers/command-process";
import { REPO_ROOT } from "./helpers/role-process";
import { freePort } from "./helpers/net";
import { describeWhere, testDatabases, TEST_NATS_URL } from "./helpers/services";
import { ensureDevelopmentCertificates, type DevelopmentCertificates } from "../lib/dev-certificates";
import { dropIntakeStreams, intakeMiddlewares } from "../lib/intake-jetstream";
import { parseConfig } from "../lib/config";

const TOPIC = "tasking:order_status";
const LOOPBACK = { WEBHOOK_ALLOW_NETS: "127.0.0.1/32,::1/128", DELIVERY_POLL_INTERVAL: "100ms", MAIL_POLL_INTERVAL: "100ms" };

let certificates: DevelopmentCertificates;
const certificateDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-examples-"));
const running: CommandProcess[] = [];

beforeAll(() => {
	// The SDK's package entry is its built dist/, as for a customer who installed it.
	execFileSync("npm", ["run", "-s", "build", "-w", "@satellite-webhooks/sdk"], { cwd: REPO_ROOT, stdio: "pipe" });
	certificates = ensureDevelopmentCertificates(certificateDir);
}, 120_000);

afterAll(async () => {
	for (const command of running) await command.stop("SIGTERM");
	fs.rmSync(certificateDir, { recursive: true, force: true });
});

/** Runs examples/receiver.mjs on `port` with the secret given, once it says it is receiving. */
async function startReceiverExample(port: number, secret: string): Promise<CommandProcess> {
	const receiver = new CommandProcess("node", ["examples/receiver.mjs"], {
		...process.env,
		WEBHOOK_SECRET: secret,
		PORT: String(port),
		TLS_CERT_FILE: path.join(certificateDir, "localhost.pem"),
		TLS_KEY_FILE: path.join(certificateDir, "localhost-key.pem"),
	});
	running.push(receiver);
	await receiver.waitForOutput(/^receiving on https:\/\/127\.0\.0\.1:\d+\/$/m);
	return receiver;
}

/** A customer with email on and a webhook to `url` (created before the receiver knows its secret). */
async function customerWebhook(stack: Stack, url: string, name = "Example receiver"): Promise<{ id: string; secret: string }> {
	const token = await stack.token("alice", { customer: "acme", email: "alice@example.com" });
	const settings = await stack.request("PUT", "/id/v3/user/settings", { token, body: { notifications: [{ category: "tasking", settings: [{ topic: TOPIC, email: true }] }] } });
	expect(settings.status).toBe(200);
	const created = await stack.request("POST", "/id/v3/webhooks", { token, body: { name, url, events: [TOPIC] } });
	expect(created.status).toBe(201);
	return { id: created.body.id, secret: created.body.secret };
}

describe.each(testDatabases())("examples/receiver.mjs and the HTTP producers (%s)", database => {
	let stack: Stack;

	beforeAll(async () => {
		stack = await startStack({ database, env: { ...LOOPBACK, WEBHOOK_CA_FILE: certificates.caFile } });
	});
	afterAll(async () => {
		await stack?.stop();
	});

	it("verifies a test delivery and an order event, and refuses one signed with another secret", async () => {
		const port = await freePort();
		const url = `https://localhost:${port}/`;
		// The webhook first: its secret is what the receiver is started with.
		const webhook = await customerWebhook(stack, url);
		const receiver = await startReceiverExample(port, webhook.secret);

		const token = await stack.token("alice", { customer: "acme" });
		const test = await stack.request("POST", `/id/v3/webhooks/${webhook.id}/test`, { token });
		expect(test.body).toMatchObject({ success: true, status_code: 200 });
		await receiver.waitForOutput(/^verified webhook:test msg_\S+: \{"webhook_id":"[0-9a-f-]{36}"/m);

		const eventId = crypto.randomUUID();
		await stack.app.broker.call("dispatcher.publish", { event_id: eventId, customer_id: "acme", user_id: "alice", order_id: "o-embedded", status: "fulfilled" });
		await receiver.waitForOutput(/^verified tasking:order_status msg_\S+: \{"order_id":"o-embedded","status":"fulfilled"/m);

		// A receiver that holds another secret refuses the delivery with 400, and the test fails.
		const strangerPort = await freePort();
		const stranger = await startReceiverExample(strangerPort, `whsec_${crypto.randomBytes(32).toString("base64")}`);
		const strangerHook = await customerWebhook(stack, `https://localhost:${strangerPort}/`, "Stranger");
		const refused = await stack.request("POST", `/id/v3/webhooks/${strangerHook.id}/test`, { token });
		expect(refused.body).toMatchObject({ success: false, status_code: 400 });
		await stranger.waitForOutput(/^refused: No matching signature found$/m);
	});

	it("examples/http-producer.mjs and http-producer.sh post order events over HTTP that end as verified deliveries at the receiver", async () => {
		const port = await freePort();
		const webhook = await customerWebhook(stack, `https://localhost:${port}/`, "HTTP producers' receiver");
		const receiver = await startReceiverExample(port, webhook.secret);
		const env = { ...process.env, API_URL: `${stack.baseUrl}/id/v3`, TOKEN: await stack.token("orders-service", { scope: "events:publish" }) };

		const withFetch = new CommandProcess("node", ["examples/http-producer.mjs"], env);
		running.push(withFetch);
		expect(await withFetch.exited).toEqual({ code: 0, signal: null });
		expect(withFetch.output).toMatch(/^stored [0-9a-f-]{36} [0-9a-f-]{36}$/m);
		await receiver.waitForOutput(/^verified tasking:order_status msg_\S+: \{"order_id":"o-2","status":"in progress"/m);
		await receiver.waitForOutput(/^verified tasking:order_status msg_\S+: \{"order_id":"o-2","status":"fulfilled"/m);

		const withCurl = new CommandProcess("bash", ["examples/http-producer.sh"], env);
		running.push(withCurl);
		expect(await withCurl.exited).toEqual({ code: 0, signal: null });
		expect(withCurl.output).toMatch(/^\{"event_ids":\["[0-9a-f-]{36}"\]\}$/m);
		await receiver.waitForOutput(/^verified tasking:order_status msg_\S+: \{"order_id":"o-3","status":"failed"/m);

		// Without a token neither sends anything: they say why and fail.
		const withoutToken = new CommandProcess("node", ["examples/http-producer.mjs"], { ...env, TOKEN: "" });
		running.push(withoutToken);
		expect((await withoutToken.exited).code).toBe(64);
		expect(withoutToken.output).toMatch(/Set TOKEN/);
	});
});

describe("the docs", () => {
	it("show examples/producer.mjs as it is, so that what readers copy is what the test runs", () => {
		const doc = fs.readFileSync(path.join(REPO_ROOT, "docs", "delivery.md"), "utf8");
		expect(doc).toContain("```js\n" + fs.readFileSync(path.join(REPO_ROOT, "examples", "producer.mjs"), "utf8") + "```");
	});
});

const describeWithCluster = describeWhere({ nats: true, postgres: true });

describeWithCluster("examples/producer.mjs, against a cluster-mode service on JetStream", () => {
	const namespace = `examples-${crypto.randomBytes(4).toString("hex")}`;
	let stack: Stack;

	beforeAll(async () => {
		stack = await startStack({
			database: "postgres",
			env: { ...LOOPBACK, WEBHOOK_CA_FILE: certificates.caFile, TRANSPORTER: TEST_NATS_URL, NAMESPACE: namespace, NODE_ID: `${namespace}-all` },
		});
	});
	afterAll(async () => {
		await stack?.stop();
		await dropIntakeStreams(TEST_NATS_URL, namespace);
	});

	it("publishes one event with a UUID event_id that ends in a verified delivery and an email, then stops its broker and exits", async () => {
		const port = await freePort();
		const webhook = await customerWebhook(stack, `https://localhost:${port}/`);
		const receiver = await startReceiverExample(port, webhook.secret);

		const producer = new CommandProcess("node", ["examples/producer.mjs"], { ...process.env, TRANSPORTER: TEST_NATS_URL, NAMESPACE: namespace });
		running.push(producer);
		// It ends by itself: `await broker.stop()` leaves nothing open.
		expect(await producer.exited).toEqual({ code: 0, signal: null });
		const [, eventId] = producer.output.match(new RegExp(`^sent ([0-9a-f-]{36}) \\(order o-1: fulfilled\\) to ${namespace}\\.tasking\\.order_status$`, "m")) ?? [];
		expect(eventId).toBeDefined();

		await receiver.waitForOutput(/^verified tasking:order_status msg_\S+: \{"order_id":"o-1","status":"fulfilled","previous_status":"in progress"/m);
		const outbox = await waitForOutbox(stack, eventId);
		expect(outbox).toMatchObject({ user_id: "alice", recipient: "alice@example.com" });
	});

	it("records an event whose event_id is not a UUID as rejected, in both rejected-events tables, as the docs show", async () => {
		const producer = new ServiceBroker({ namespace, nodeID: `${namespace}-bad-producer`, transporter: TEST_NATS_URL, logger: false, middlewares: intakeMiddlewares(parseConfig({ TRANSPORTER: TEST_NATS_URL, NAMESPACE: namespace })) });
		await producer.start();
		try {
			await (producer as unknown as { sendToChannel(channel: string, payload: unknown): Promise<void> }).sendToChannel("tasking.order_status", { event_id: "o-1-fulfilled", user_id: "alice", order_id: "o-1", status: "fulfilled" });
		} finally {
			await producer.stop();
		}
		const dispatcherRow = await waitForRow(() => stack.db("delivery_rejected_events").where({ event_id: "o-1-fulfilled" }).first());
		expect(dispatcherRow).toMatchObject({ source: "channel", reason: "event_id: must be a UUID" });
		expect(JSON.parse(dispatcherRow.excerpt)).toMatchObject({ event_id: "o-1-fulfilled" });
		const notifierRow = await waitForRow(() => stack.db("email_rejected_events").whereLike("payload", "%o-1-fulfilled%").first());
		expect(JSON.parse(notifierRow.errors)).toEqual([{ path: "event_id", message: "must be a UUID" }]);
	});
});

async function waitForRow<T>(read: () => Promise<T | undefined>): Promise<T> {
	for (let tries = 0; tries < 300; tries++) {
		const row = await read();
		if (row) return row;
		await sleep(100);
	}
	throw new Error("no row within 30 s");
}

function waitForOutbox(stack: Stack, eventId: string): Promise<{ user_id: string; recipient: string }> {
	return waitForRow(async () => {
		const entries: Array<{ event_id: string; user_id: string; recipient: string; status: string }> = await stack.app.broker.call("notifier.outbox", { limit: 500 });
		return entries.find(entry => entry.event_id === eventId && entry.status === "sent");
	});
}
