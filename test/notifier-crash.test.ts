// Crash safety of the email outbox. The notifier runs as a real child process (server.ts with
// SERVICES=notifier) joined over NATS to this test's broker, which runs the gateway and users.
// A real SMTP server here answers slowly (or not until told); the child is killed with SIGKILL
// while it sends, restarted, killed again… Afterwards every email must have arrived (none lost),
// and the duplicates are counted. A resend can only duplicate an email whose 250 the server
// sent before the dying process recorded it: the first scenario never kills in that window (no
// duplicate allowed), the second aims at it on purpose and reports what it caught.
import { setTimeout as sleep } from "node:timers/promises";
import { spawn, type ChildProcess } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { dropIntakeStreams } from "../lib/intake-jetstream";
import { startStack, type Stack } from "./helpers/stack";
import { serviceCommand } from "./helpers/service-build";
import { describeWhere, dropTestSchema, testDatabases, TEST_DATABASE_URL, TEST_NATS_URL, type DatabaseKind } from "./helpers/services";
import { startSmtpServer, type TestSmtpServer } from "./helpers/smtp-server";
import type { OutboxEntry } from "../services/notifier.service";

const EVENTS = 24;
const KILLS = 4;
const CONCURRENCY = 3;
const ACCEPT_DELAY_MS = 300;
const REPO_ROOT = path.resolve(__dirname, "..");

const describeWithNats = describeWhere({ nats: true });

interface NotifierProcess {
	nodeId: string;
	child: ChildProcess;
	output: string[];
	exited: Promise<void>;
}

interface CrashFigures {
	scenario: string;
	database: DatabaseKind;
	events: number;
	kills: number;
	concurrency: number;
	delivered_distinct: number;
	delivered_total: number;
	duplicates: number;
	lost: number;
	abandoned_mid_send: number;
	outbox_attempts_total: number;
}

/**
 * One cluster per scenario: this test's broker (gateway, topics, users) and a notifier child
 * process, in a fresh NATS namespace. Fresh, because killed nodes linger in a broker's registry
 * until their heartbeat times out, and an event balanced to one of them would never arrive.
 */
class CrashCluster {
	readonly namespace = `crash-${crypto.randomBytes(4).toString("hex")}`;
	readonly schema: string | undefined;
	stack!: Stack;
	smtp!: TestSmtpServer;
	current!: NotifierProcess;
	private childDataDir!: string;
	private readonly started: NotifierProcess[] = [];
	private stopped = false;

	constructor(readonly database: DatabaseKind) {
		this.schema = database === "postgres" ? `t_${crypto.randomBytes(6).toString("hex")}` : undefined;
	}

	async start(): Promise<void> {
		this.smtp = await startSmtpServer();
		this.childDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-notifier-child-"));
		// The child starts while this test's broker does (its start-up, 2-3 s of loading on a busy
		// machine, came after the broker's); it is waited for below, once the broker can see it.
		this.current = this.spawnNotifier();
		this.stack = await startStack({
			database: this.database,
			services: ["api", "topics", "users"],
			env: { TRANSPORTER: TEST_NATS_URL, NAMESPACE: this.namespace, NODE_ID: `${this.namespace}-test` },
		});
		const token = await this.stack.token("alice", { email: "alice@example.com", name: "Alice" });
		const settings = await this.stack.request("PUT", "/id/v3/user/settings", {
			token,
			body: { notifications: [{ category: "tasking", settings: [{ topic: "tasking:order_status", email: true }] }] },
		});
		expect(settings.status).toBe(200);
		await this.waitForNode(this.current);
	}

	async stop(): Promise<void> {
		// A test body that timed out may still be running: it must not start children after this.
		this.stopped = true;
		for (const notifier of this.started) {
			if (notifier.child.exitCode === null && notifier.child.signalCode === null) notifier.child.kill("SIGKILL");
			await notifier.exited;
		}
		await this.stack?.stop();
		await this.smtp?.close();
		// The namespace is this cluster's alone: its streams would stay on the shared NATS server.
		await dropIntakeStreams(TEST_NATS_URL, this.namespace);
		if (this.schema) {
			await dropTestSchema(this.schema);
		}
		if (this.childDataDir) fs.rmSync(this.childDataDir, { recursive: true, force: true });
	}

	private spawnNotifier(): NotifierProcess {
		if (this.stopped) throw new Error("the crash cluster was stopped");
		const nodeId = `${this.namespace}-notifier-${this.started.length + 1}`;
		const env: Record<string, string> = {
			PATH: process.env.PATH ?? "",
			NODE_ENV: "test",
			SERVICES: "notifier",
			TRANSPORTER: TEST_NATS_URL,
			NAMESPACE: this.namespace,
			NODE_ID: nodeId,
			DATA_DIR: this.childDataDir,
			OPS_PORT: "0",
			LOG_LEVEL: "warn",
			SMTP_URL: this.smtp.url,
			MAIL_CONCURRENCY: String(CONCURRENCY),
			MAIL_LEASE: "1500ms",
			MAIL_POLL_INTERVAL: "100ms",
			MAIL_SEND_TIMEOUT: "5s",
			MAIL_RETRY_SCHEDULE: "200ms,400ms,600ms,800ms,1s,2s,3s,4s,5s,6s",
			...(this.schema ? { DATABASE_URL: TEST_DATABASE_URL, DATABASE_SCHEMA: this.schema } : {}),
		};
		// Plain node, one process, so SIGKILL really kills the notifier.
		const { command, args } = serviceCommand();
		const child = spawn(command, args, { cwd: REPO_ROOT, env, stdio: ["ignore", "pipe", "pipe"] });
		const output: string[] = [];
		child.stdout!.on("data", chunk => output.push(String(chunk)));
		child.stderr!.on("data", chunk => output.push(String(chunk)));
		const exited = new Promise<void>(resolve => child.once("exit", () => resolve()));
		const notifier = { nodeId, child, output, exited };
		this.started.push(notifier);
		return notifier;
	}

	private async waitForNode(notifier: NotifierProcess): Promise<void> {
		for (let i = 0; i < 600; i++) {
			const node = this.stack.app.broker.registry.nodes.get(notifier.nodeId);
			if (node?.available && node.services.some((service: { name: string }) => service.name === "notifier")) return;
			if (notifier.child.exitCode !== null || notifier.child.signalCode !== null) break;
			await sleep(50);
		}
		throw new Error(`notifier child ${notifier.nodeId} did not come up:\n${notifier.output.join("")}`);
	}

	async killAndRestart(): Promise<void> {
		this.current.child.kill("SIGKILL");
		await this.current.exited;
		this.current = this.spawnNotifier();
		await this.waitForNode(this.current);
	}

	/** The live notifier's outbox (asked of that node: dead ones may still be listed). */
	outbox(): Promise<OutboxEntry[]> {
		return this.stack.app.broker.call("notifier.outbox", { limit: 500 }, { nodeID: this.current.nodeId, timeout: 5_000 });
	}

	/** Emits terminal-status events for alice and waits until all are in the outbox. */
	async emitBatch(): Promise<string[]> {
		const eventIds: string[] = Array.from({ length: EVENTS }, () => crypto.randomUUID());
		for (const [index, eventId] of eventIds.entries()) {
			await this.stack.app.broker.emit("tasking.order_status", {
				event_id: eventId,
				user_id: "alice",
				order_id: `ord-${index}`,
				status: ["fulfilled", "failed", "expired"][index % 3],
				order_name: `Crash test order ${index}`,
			});
		}
		// The guarantee under test starts once an email is in the outbox.
		let recorded = 0;
		for (let i = 0; i < 200 && recorded < EVENTS; i++) {
			recorded = (await this.outbox()).filter(entry => eventIds.includes(entry.event_id ?? "")).length;
			if (recorded < EVENTS) await sleep(50);
		}
		expect(recorded).toBe(EVENTS);
		return eventIds;
	}

	/**
	 * Resolves once every email of these events is sent (never, if that takes over `boundMs`).
	 * Stops asking once `settled` is aborted: a question still on its way to a killed notifier
	 * when the cluster stops holds the broker's stop for its whole shutdown timeout (10 s).
	 */
	async allSent(eventIds: string[], boundMs: number, settled: AbortSignal): Promise<void> {
		for (const deadline = Date.now() + boundMs; Date.now() < deadline && !settled.aborted; await sleep(100)) {
			// The outbox is the live notifier's: an unanswered question is "not yet".
			const entries = (await this.outbox().catch(() => [] as OutboxEntry[])).filter(entry => eventIds.includes(entry.event_id ?? ""));
			if (entries.length === eventIds.length && entries.every(entry => entry.status === "sent")) return;
		}
		await new Promise(() => undefined);
	}

	/** Waits (bounded) until every email is sent and nothing is on its way, then counts. */
	async outcome(eventIds: string[], scenario: string, kills = KILLS): Promise<CrashFigures> {
		let entries: OutboxEntry[] = [];
		for (let i = 0; i < 1200; i++) {
			entries = (await this.outbox()).filter(entry => eventIds.includes(entry.event_id ?? ""));
			if (entries.length === EVENTS && entries.every(entry => entry.status === "sent") && this.smtp.inProgress() === 0) break;
			await sleep(50);
		}
		const messageIds = new Set(entries.map(entry => entry.message_id));
		const delivered = this.smtp.received.filter(mail => messageIds.has(mail.messageId));
		const distinct = new Set(delivered.map(mail => mail.messageId)).size;
		const figures: CrashFigures = {
			scenario,
			database: this.database,
			events: EVENTS,
			kills,
			concurrency: CONCURRENCY,
			delivered_distinct: distinct,
			delivered_total: delivered.length,
			duplicates: delivered.length - distinct,
			lost: EVENTS - distinct,
			abandoned_mid_send: this.smtp.abandoned.length,
			outbox_attempts_total: entries.reduce((sum, entry) => sum + entry.attempts, 0),
		};
		console.log(`notifier crash figures: ${JSON.stringify(figures)}`);
		expect(entries.map(entry => entry.status)).toEqual(Array(EVENTS).fill("sent"));
		expect(this.smtp.received.every(mail => messageIds.has(mail.messageId) && mail.envelope.to.join() === "alice@example.com")).toBe(true);
		return figures;
	}
}

describeWithNats.each(testDatabases())("notifier crash safety on %s", (database: DatabaseKind) => {
	describe("killed while the server holds the message", () => {
		const cluster = new CrashCluster(database);
		beforeAll(() => cluster.start(), 60_000);
		afterAll(() => cluster.stop(), 60_000);

		it("loses no email and sends none twice", async () => {
			const eventIds = await cluster.emitBatch();
			// Every message waits unanswered, so each kill lands mid-send and never after a 250.
			cluster.smtp.setHold(true);
			for (let kill = 0; kill < KILLS; kill++) {
				for (let i = 0; i < 600 && cluster.smtp.heldCount() === 0; i++) await sleep(50);
				const held = cluster.smtp.heldCount();
				expect(held).toBeGreaterThan(0);
				const abandonedBefore = cluster.smtp.abandoned.length;
				await cluster.killAndRestart();
				// The server saw the dead client's connection close and abandoned what it held.
				for (let i = 0; i < 600 && cluster.smtp.abandoned.length < abandonedBefore + held; i++) await sleep(50);
				expect(cluster.smtp.abandoned.length).toBeGreaterThanOrEqual(abandonedBefore + held);
			}
			cluster.smtp.setHold(false);
			cluster.smtp.releaseHeld();

			const figures = await cluster.outcome(eventIds, "killed while the server held the message");
			expect(figures.lost).toBe(0);
			expect(figures.duplicates).toBe(0);
			expect(figures.abandoned_mid_send).toBeGreaterThanOrEqual(KILLS);
		}, 240_000);
	});

	describe("killed at random moments of a slow send", () => {
		const cluster = new CrashCluster(database);
		beforeAll(() => cluster.start(), 60_000);
		afterAll(() => cluster.stop(), 60_000);

		it("loses no email, and counts the duplicates", async () => {
			cluster.smtp.setAcceptDelay(ACCEPT_DELAY_MS);
			const eventIds = await cluster.emitBatch();
			let kills = 0;
			while (kills < KILLS) {
				// A restarted notifier may already have sent everything that was left: then there is
				// nothing more to interrupt (whether every email arrived is checked below), and the
				// loop ends as soon as the outbox says so rather than after the 15 s wait for a send.
				const raced = new AbortController();
				const sending = await Promise.race([
					cluster.smtp.waitForDataInProgress(15_000).then(
						() => true,
						() => false,
					),
					cluster.allSent(eventIds, 15_000, raced.signal).then(() => false),
				]);
				raced.abort();
				if (!sending) break;
				// Sometimes while the server still holds the message, sometimes just after its 250:
				// both sides of the only window in which a resend duplicates.
				await sleep(crypto.randomInt(0, ACCEPT_DELAY_MS + 100));
				await cluster.killAndRestart();
				kills += 1;
			}
			expect(kills).toBeGreaterThan(0);
			const figures = await cluster.outcome(eventIds, "killed at random moments", kills);
			expect(figures.lost).toBe(0);
			// A kill can only duplicate the sends it caught around their 250: at most CONCURRENCY each.
			expect(figures.duplicates).toBeLessThanOrEqual(kills * CONCURRENCY);
		}, 240_000);
	});
});
