// The operators' REPL commands (lib/repl-commands.ts), driven through a real `npm run repl`
// process (`npm run repl`, scripts/repl.ts) by piping commands into its standard input, one at a time: in the
// embedded mode (the REPL is the service's prompt) and as a node that joined a cluster over NATS
// and runs no service. Every command is run with good and bad arguments; no output ever shows a
// secret. A second embedded REPL beside a running one stops at once, saying what to do.
import { setTimeout as sleep } from "node:timers/promises";
import { spawn, type ChildProcess } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { loadConfig } from "../lib/config";
import { dropIntakeStreams } from "../lib/intake-jetstream";
import { nextAttemptCell } from "../lib/repl-commands";
import { mintToken } from "../lib/auth";
import { freePort } from "./helpers/net";
import { describeWhere, TEST_NATS_URL } from "./helpers/services";
import { startHttpsReceiver, type HttpsReceiver } from "./helpers/https-receiver";
import { startStack, type Stack } from "./helpers/stack";
import { FAST_DELIVERY_ENV, SHORT_RETRY_SCHEDULE, waitUntil } from "./helpers/delivery-stack";

// `deliveries` waits for the failing webhook's delivery to have run out of its retries, in each mode.
const REPL_DELIVERY_ENV = { ...FAST_DELIVERY_ENV, DELIVERY_RETRY_SCHEDULE: SHORT_RETRY_SCHEDULE };

const ROOT = path.resolve(__dirname, "..");
const UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";

interface ReplProcess {
	child: ChildProcess;
	output(): string;
	/** Sends one command line and resolves with what it printed once `expected` shows up. */
	run(line: string, expected: RegExp): Promise<string>;
	/** Re-runs a command until its output matches (for state that changes in the background). */
	runUntil(line: string, expected: RegExp): Promise<string>;
	stop(): Promise<void>;
}

function startRepl(env: Record<string, string>): ReplProcess {
	const base = Object.fromEntries(Object.entries(process.env).filter(([name]) => !/^(npm_|TRANSPORTER|NAMESPACE|DATABASE_|DATA_DIR|PORT|OPS_PORT|SERVICES)/.test(name)));
	// Exactly as docs/operations.md says: `npm run repl` (-s only keeps npm's banner out of the output).
	const child = spawn("npm", ["run", "-s", "repl"], { cwd: ROOT, env: { ...base, HOME: os.tmpdir(), ...env }, stdio: ["pipe", "pipe", "pipe"] });
	let output = "";
	child.stdout!.on("data", chunk => (output += chunk));
	child.stderr!.on("data", chunk => (output += chunk));
	const run = async (line: string, expected: RegExp) => {
		const from = output.length;
		child.stdin!.write(`${line}\n`);
		const printed = await waitUntil(() => output.slice(from), text => expected.test(text), `"${line}" to print ${expected}`);
		// Let the rest of the table arrive before the next command.
		await sleep(100);
		return printed + output.slice(from + printed.length);
	};
	return {
		child,
		output: () => output,
		run,
		async runUntil(line, expected) {
			return waitUntil(() => run(line, /mol \$|\n/), text => expected.test(text), `"${line}" to print ${expected} eventually`);
		},
		async stop() {
			if (child.exitCode !== null || child.signalCode !== null) return;
			const exited = new Promise(resolve => child.once("exit", resolve));
			child.stdin!.end();
			await exited;
		},
	};
}

interface Scenario {
	repl: ReplProcess;
	receiver: HttpsReceiver;
	/** Creates a webhook of customer acme through the API; `fields` adds to the body. */
	createWebhook(name: string, receiverPath: string, fields?: object): Promise<{ id: string; secret: string }>;
	tokens: () => string[];
}

/** Every command, the same way in both modes. */
function describeCommands(setup: () => Scenario) {
	let s: Scenario;
	let ok: { id: string; secret: string };
	let failing: { id: string; secret: string };
	const failingDeliveries = () => s.receiver.requests.filter(request => request.path === "/repl-fail");

	beforeAll(async () => {
		s = setup();
		s.receiver.setDefault(request => (request.path === "/repl-fail" ? { status: 500 } : { status: 200, body: "ok" }));
		// A limit far above what these tests send: it shows in the listing and holds nothing back.
		ok = await s.createWebhook(`ok ${crypto.randomBytes(3).toString("hex")}`, "/repl-ok", { rate_limit: 1000 });
		failing = await s.createWebhook(`failing ${crypto.randomBytes(3).toString("hex")}`, "/repl-fail");
	});

	it("topics and register-topic", async () => {
		expect(await s.repl.run("topics", /tasking:order_status/)).toMatch(/tasking:order_status\s*\|\s*tasking\s*\|\s*Tasking order status updates\s*\|\s*yes\s*\|\s*yes/);
		const registered = await s.repl.run('register-topic imagery:ready "Imagery ready" "When imagery can be downloaded" --email', /imagery:ready|error/);
		expect(registered).toMatch(/imagery:ready\s*\|\s*imagery\s*\|\s*Imagery ready\s*\|\s*yes\s*\|\s*yes/);
		expect(await s.repl.run("topics", /imagery:ready/)).toContain("When imagery can be downloaded");
		expect(await s.repl.run("register-topic Imagery:Ready x y", /error/)).toMatch(/error: topic must look like <category>:<name>, lower case/);
		expect(await s.repl.run('register-topic imagery:late "" "desc"', /error/)).toMatch(/error: name/);
	});

	it("webhooks <customer>", async () => {
		const listed = await s.repl.run("webhooks acme", /latest delivery/);
		expect(listed).toContain(ok.id);
		expect(listed).toContain(failing.id);
		expect(listed).toMatch(new RegExp(`${ok.id}\\s*\\|\\s*ok \\w+\\s*\\|\\s*https://127\\.0\\.0\\.1:\\d+/repl-ok\\s*\\|\\s*tasking:order_status\\s*\\|\\s*yes\\s*\\|\\s*-\\s*\\|\\s*per_order\\s*\\|\\s*1000/s\\s*\\|`));
		expect(listed).toMatch(new RegExp(`${failing.id}\\s*\\|.*\\|\\s*per_order\\s*\\|\\s*none\\s*\\|`));
		expect(await s.repl.run("webhooks nobody-here", /No webhooks/)).toContain("No webhooks for customer nobody-here.");
		expect(await s.repl.run("webhooks 'a b'", /error/)).toMatch(/error: customer must be 1\.\.200 characters/);
		expect(await s.repl.run("webhooks", /missing required argument/)).toMatch(/missing required argument 'customer'/);
	});

	it("send-test-event goes through the producers' intake and reaches both webhooks", async () => {
		const sent = await s.repl.run("send-test-event acme alice Fulfilled", /sent as|error/);
		expect(sent).toMatch(new RegExp(`${UUID}\\s*\\|\\s*acme\\s*\\|\\s*alice\\s*\\|\\s*repl-test-\\w+\\s*\\|\\s*fulfilled\\s*\\|\\s*(event|channel)`));
		await waitUntil(() => s.receiver.requests.filter(request => request.path === "/repl-ok").length, count => count >= 1, "the delivery to the ok webhook");
		await waitUntil(() => failingDeliveries().length, count => count >= 1, "an attempt at the failing webhook");
		expect(await s.repl.run("send-test-event acme alice bogus", /error/)).toMatch(/error: status must be one of: committed, staged/);
		expect(await s.repl.run("send-test-event 'bad customer' alice fulfilled", /error/)).toMatch(/error: customer_id must be 1\.\.200/);
	});

	it("deliveries <webhook-id> [--status] [--since]", async () => {
		expect(await s.repl.runUntil(`deliveries ${ok.id}`, /succeeded/)).toMatch(new RegExp(`${UUID}\\s*\\|\\s*\\S+Z\\s*\\|\\s*succeeded\\s*\\|\\s*1\\s*\\|\\s*200`));
		expect(await s.repl.run(`deliveries ${ok.id} --status failed`, /No deliveries match|error/)).toContain("No deliveries match.");
		expect(await s.repl.run(`deliveries ${ok.id} --since 1h`, /succeeded|No deliveries/)).toContain("succeeded");
		expect(await s.repl.run(`deliveries ${ok.id} --since 2099-01-01T00:00:00Z`, /No deliveries|error/)).toContain("No deliveries match.");
		// The failing webhook's delivery gives up after the (fast) retry schedule.
		expect(await s.repl.runUntil(`deliveries ${failing.id} --status failed`, /\|\s*failed\s*\|/)).toMatch(/failed\s*\|\s*6\s*\|\s*500\s*\|\s*http_status/);
		expect(await s.repl.run("deliveries not-a-uuid", /error/)).toMatch(/error: webhook id must be a UUID, got "not-a-uuid"/);
		expect(await s.repl.run(`deliveries ${ok.id} --status lost`, /error/)).toMatch(/error: --status must be one of: pending, succeeded, failed, cancelled/);
		expect(await s.repl.run(`deliveries ${ok.id} --since yesterday`, /error/)).toMatch(/error: --since must be an ISO 8601 timestamp or a duration ago/);
		expect(await s.repl.run(`deliveries ${crypto.randomUUID()}`, /error/)).toMatch(/error: Webhook not found/);
	});

	it("retry <delivery-id> and retry-failed <webhook-id> --since", async () => {
		const listed = await s.repl.run(`deliveries ${failing.id} --status failed`, /failed/);
		const deliveryId = new RegExp(`(${UUID})\\s*\\|\\s*\\S+Z\\s*\\|\\s*failed`).exec(listed)![1];
		const before = failingDeliveries().length;
		const retried = await s.repl.run(`retry ${deliveryId}`, /Scheduled|error/);
		expect(retried).toMatch(new RegExp(`${deliveryId}\\s*\\|\\s*${failing.id}\\s*\\|\\s*pending`));
		expect(retried).toContain("Scheduled 1 attempt.");
		await waitUntil(() => failingDeliveries().length, count => count === before + 1, "the hand retry's attempt");
		// One attempt only: it fails again, and retry-failed schedules it once more.
		await s.repl.runUntil(`deliveries ${failing.id} --status failed`, /\|\s*failed\s*\|\s*7\s*\|/);
		expect(await s.repl.run(`retry-failed ${failing.id} --since 1h`, /Scheduled|error/)).toContain("Scheduled 1 attempt(s).");
		await waitUntil(() => failingDeliveries().length, count => count === before + 2, "retry-failed's attempt");
		expect(await s.repl.run(`retry-failed ${ok.id} --since 1h`, /Scheduled|error/)).toContain("Scheduled 0 attempt(s).");
		expect(await s.repl.run(`retry-failed ${failing.id}`, /error/)).toMatch(/error: retry-failed needs --since <time>/);
		expect(await s.repl.run(`retry ${crypto.randomUUID()}`, /error/)).toMatch(/error: Delivery not found/);
		expect(await s.repl.run("retry 42", /error/)).toMatch(/error: delivery id must be a UUID/);
	});

	it("disable and enable", async () => {
		expect(await s.repl.run(`disable ${ok.id}`, /active|error/)).toMatch(new RegExp(`${ok.id}\\s*\\|\\s*ok \\w+\\s*\\|\\s*acme\\s*\\|\\s*no`));
		expect(await s.repl.run("webhooks acme", /latest delivery/)).toMatch(new RegExp(`${ok.id}.*\\|\\s*no\\s*\\|\\s*user since \\d{4}-\\d\\d-\\d\\dT\\S+Z\\s*\\|`));
		expect(await s.repl.run(`enable ${ok.id}`, /active|error/)).toMatch(new RegExp(`${ok.id}\\s*\\|\\s*ok \\w+\\s*\\|\\s*acme\\s*\\|\\s*yes`));
		expect(await s.repl.run(`disable ${crypto.randomUUID()}`, /error/)).toMatch(/error: Webhook not found/);
		expect(await s.repl.run("enable x", /error/)).toMatch(/error: webhook id must be a UUID/);
	});

	it("outbox [--status]", async () => {
		expect(await s.repl.runUntil("outbox", /alice@example\.com/)).toMatch(/\|\s*(sent|pending)\s*\|\s*alice@example\.com\s*\|\s*repl-test-\w+\s*\|\s*fulfilled/);
		expect(await s.repl.runUntil("outbox --status sent", /alice@example\.com/)).toMatch(/sent\s*\|\s*alice@example\.com/);
		expect(await s.repl.run("outbox --status failed", /holds no such email|error/)).toContain("The outbox holds no such email.");
		expect(await s.repl.run("outbox --status lost", /error/)).toMatch(/error: --status must be one of: pending, sent, failed, skipped/);
		expect(await s.repl.run("outbox --limit 0", /error/)).toMatch(/error: --limit must be a whole number from 1 to 500/);
	});

	it("backlog", async () => {
		const backlog = await s.repl.run("backlog", /Emails by status/);
		expect(backlog).toMatch(/deliveries\s*\|\s*\d+\s*\|\s*\d+\s*\|/);
		expect(backlog).toMatch(/emails\s*\|\s*\d+\s*\|/);
		expect(backlog).toMatch(/Emails by status: pending \d+, sent [1-9]\d*, failed \d+, skipped \d+/);
	});

	it("never printed a secret or a token", () => {
		const output = s.repl.output();
		expect(output).not.toContain("whsec_");
		for (const secret of [ok.secret, failing.secret, ...s.tokens()]) expect(output).not.toContain(secret);
	});
}

const apiRequest = async (baseUrl: string, token: string, method: string, urlPath: string, body?: unknown) => {
	const response = await fetch(baseUrl + urlPath, { method, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: body ? JSON.stringify(body) : undefined });
	const text = await response.text();
	if (!response.ok) throw new Error(`${method} ${urlPath}: ${response.status} ${text}`);
	return text ? JSON.parse(text) : undefined;
};
const EMAIL_ON = { notifications: [{ category: "tasking", settings: [{ topic: "tasking:order_status", email: true }] }] };

describe("REPL, embedded: the service's own prompt", () => {
	let receiver: HttpsReceiver;
	let repl: ReplProcess;
	let dataDir: string;
	let apiPort: number;
	let opsPort: number;
	let token: string;

	beforeAll(async () => {
		receiver = await startHttpsReceiver();
		dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-repl-"));
		apiPort = await freePort();
		opsPort = await freePort();
		repl = startRepl({
			...REPL_DELIVERY_ENV,
			WEBHOOK_CA_FILE: receiver.writeCaFile(),
			DATA_DIR: dataDir,
			PORT: String(apiPort),
			OPS_PORT: String(opsPort),
			HOST: "127.0.0.1",
			MAIL_POLL_INTERVAL: "100ms",
		});
		await waitUntil(repl.output, output => output.includes('Type "help"'), "the REPL's prompt");
		token = await mintToken(loadConfig({ DATA_DIR: dataDir }).config, { sub: "alice", customer: "acme", email: "alice@example.com" });
		await apiRequest(`http://127.0.0.1:${apiPort}`, token, "PUT", "/id/v3/user/settings", EMAIL_ON);
	});
	afterAll(async () => {
		await repl?.stop();
		await receiver?.close();
		fs.rmSync(dataDir, { recursive: true, force: true });
	});

	describeCommands(() => ({
		repl,
		receiver,
		tokens: () => [token],
		createWebhook: (name, receiverPath, fields) =>
			apiRequest(`http://127.0.0.1:${apiPort}`, token, "POST", "/id/v3/webhooks", { name, url: receiver.url + receiverPath, events: ["tasking:order_status"], ...fields }),
	}));

	it("a second REPL beside it stops at once, saying what to do", async () => {
		const second = startRepl({ DATA_DIR: dataDir, PORT: String(apiPort), OPS_PORT: String(opsPort), HOST: "127.0.0.1" });
		const code = await new Promise(resolve => second.child.once("exit", resolve));
		expect(code).toBe(75);
		expect(second.output()).toMatch(new RegExp(`PORT ${apiPort} and OPS_PORT ${opsPort} are already in use: is \`npm start\``));
		expect(second.output()).toContain("Stop the running service and start it with the prompt instead: npm run repl");
		expect(second.output()).toContain("`npm run repl` joins it as a node running no service");
	});
});

describe("REPL beside a running `npm start`", () => {
	let server: ChildProcess;
	let dataDir: string;
	let apiPort: number;
	let opsPort: number;

	beforeAll(async () => {
		dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-repl-start-"));
		apiPort = await freePort();
		opsPort = await freePort();
		const base = Object.fromEntries(Object.entries(process.env).filter(([name]) => !/^(npm_|TRANSPORTER|NAMESPACE|DATABASE_)/.test(name)));
		server = spawn("npm", ["start"], { cwd: ROOT, env: { ...base, DATA_DIR: dataDir, PORT: String(apiPort), OPS_PORT: String(opsPort), HOST: "127.0.0.1", LOG_LEVEL: "warn" }, detached: true, stdio: "ignore" });
		await waitUntil(
			() => fetch(`http://127.0.0.1:${opsPort}/health`).then(response => response.status, () => 0),
			status => status === 200,
			"npm start to be healthy",
		);
	});
	afterAll(async () => {
		// npm does not pass signals on to its child: stop the whole process group.
		if (server?.pid && server.exitCode === null) {
			const exited = new Promise(resolve => server.once("exit", resolve));
			process.kill(-server.pid, "SIGTERM");
			await exited;
		}
		fs.rmSync(dataDir, { recursive: true, force: true });
	});

	it("fails at once with the service's ports taken, saying what to do, and starts nothing", async () => {
		const second = startRepl({ DATA_DIR: dataDir, PORT: String(apiPort), OPS_PORT: String(opsPort), HOST: "127.0.0.1" });
		const code = await new Promise(resolve => second.child.once("exit", resolve));
		expect(code).toBe(75);
		expect(second.output()).toMatch(new RegExp(`PORT ${apiPort} and OPS_PORT ${opsPort} are already in use: is \`npm start\``));
		expect(second.output()).not.toContain("Services running");
	});
});

const describeWithNats = describeWhere({ nats: true });

describeWithNats("REPL joined to a cluster over NATS, running no service", () => {
	let receiver: HttpsReceiver;
	let stack: Stack;
	let repl: ReplProcess;
	let token: string;
	const namespace = `repl-${crypto.randomBytes(4).toString("hex")}`;
	const replDataDir = path.join(os.tmpdir(), `swh-repl-node-${crypto.randomBytes(4).toString("hex")}`);

	beforeAll(async () => {
		receiver = await startHttpsReceiver();
		stack = await startStack({
			env: { ...REPL_DELIVERY_ENV, WEBHOOK_CA_FILE: receiver.writeCaFile(), TRANSPORTER: TEST_NATS_URL, NAMESPACE: namespace, MAIL_POLL_INTERVAL: "100ms" },
		});
		token = await stack.token("alice", { customer: "acme", email: "alice@example.com" });
		await apiRequest(stack.baseUrl, token, "PUT", "/id/v3/user/settings", EMAIL_ON);
		// No database, no secrets, no ports: only where the cluster is. DATA_DIR points nowhere
		// to show that the node creates nothing there.
		repl = startRepl({ TRANSPORTER: TEST_NATS_URL, NAMESPACE: namespace, DATA_DIR: replDataDir, NODE_ENV: "production" });
		await waitUntil(repl.output, output => output.includes('Type "help"'), "the REPL to join");
	});
	afterAll(async () => {
		await repl?.stop();
		await stack?.stop();
		await receiver?.close();
		await dropIntakeStreams(TEST_NATS_URL, namespace);
	});

	it("is started as docs/operations.md shows: npm run repl with only where the cluster is", () => {
		const doc = fs.readFileSync(path.join(ROOT, "docs", "operations.md"), "utf8");
		const [line] = [...doc.matchAll(/```sh\n([\s\S]*?)```/g)].map(match => match[1].trim()).filter(block => block.includes("npm run repl"));
		// The same two variables this suite gives its REPL, and the command startRepl runs.
		expect(line).toMatch(/^TRANSPORTER=nats:\/\/\S+ NAMESPACE=\S+ npm run repl$/);
	});

	it("is a node of the cluster with no service of its own", async () => {
		expect(repl.output()).toMatch(/Joined the cluster at nats:\/\/[^ ]+ \(namespace repl-\w+\) as repl-[\w.-]+, running no service/);
		const nodeId = /as (repl-[\w.-]+), running/.exec(repl.output())![1];
		const nodes = await repl.run("nodes", /Node ID/);
		expect(nodes).toContain(nodeId);
		expect(nodes).toContain(stack.app.broker.nodeID);
		const local = stack.app.broker.registry.getServiceList({ onlyLocal: false, skipInternal: true, withActions: false }) as Array<{ name: string; nodeID: string }>;
		expect(local.filter(service => service.nodeID === nodeId)).toEqual([]);
		expect(fs.existsSync(replDataDir)).toBe(false);
	});

	describeCommands(() => ({
		repl,
		receiver,
		tokens: () => [token],
		createWebhook: (name, receiverPath, fields) => apiRequest(stack.baseUrl, token, "POST", "/id/v3/webhooks", { name, url: receiver.url + receiverPath, events: ["tasking:order_status"], ...fields }),
	}));
});

describe("the deliveries table's last column", () => {
	it("names the earlier delivery a waiting one waits for, instead of a next attempt", () => {
		const earlier = crypto.randomUUID();
		expect(nextAttemptCell({ next_attempt_at: null, waiting_for: earlier })).toBe(`waiting for ${earlier}`);
		expect(nextAttemptCell({ next_attempt_at: "2026-11-21T10:00:00.000Z", waiting_for: null })).toBe("2026-11-21T10:00:00.000Z");
		// Parked (webhook disabled) or in flight: neither a time nor a wait.
		expect(nextAttemptCell({ next_attempt_at: null, waiting_for: null })).toBeNull();
	});
});
