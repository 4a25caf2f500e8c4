// A whole cluster for one test, every part of it real and owned by the test: its own NATS server
// with JetStream (stoppable), a PostgreSQL schema (optionally behind a TCP relay the test can
// cut), a real HTTPS receiver, a real SMTP server, and the roles as child processes of
// `server.ts` (gateway, dispatchers, notifier), each logging to its own file. Outside producers
// are Moleculer brokers in the test process that send to the JetStream channel.
//
//   const cluster = await Cluster.start({ label: "fault-1" });
//   await cluster.startRoles(["gateway", "gateway"], ["dispatcher", "dispatcher-1"], ["notifier", "notifier"]);
//   const token = await cluster.token("alice", { customer: "acme", email: "alice@example.com" });
//   const hook = await cluster.createWebhook(token);
//   await cluster.send(events);                 // sendToChannel from an outside node
//   await cluster.role("dispatcher-1").kill();  // SIGKILL
//   cluster.deliveryFigures([hook], events)     // sent, delivered, lost, repeats
//   await cluster.close();                      // in afterAll: everything down, even on failure
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import knex, { type Knex } from "knex";
import { ServiceBroker, type Middleware } from "moleculer";
import { Middleware as ChannelsMiddleware } from "@moleculer/channels";
import { connect } from "nats";
import { mintToken } from "../../lib/auth";
import { natsServerOptions, type NatsServerOptions } from "../../lib/connection-urls";
import { implicitCustomerId } from "../../lib/customers";
import { intakeDeliverSubject, intakeNames, type IntakeGroup } from "../../lib/intake-channel";
import { parseConfig } from "../../lib/config";
import { EMAIL_STATUSES, ORDER_STATUSES, TASKING_ORDER_STATUS_EVENT, type OrderStatus, type TaskingOrderStatusInput } from "../../lib/schemas/events";
import { answeredKeyCount, countDeliveries, countEmails, expectedDeliveryKeys, type DeliveryFigures, type EmailFigures } from "./arrival-counts";
import { pathOf, startHttpsReceiver, type HttpsReceiver, type ReceivedRequest, type Responder, type ScriptedResponse } from "./https-receiver";
import { NATS_SERVER_BIN, startNatsServer, type NatsEnv, type NatsServer } from "./nats-server";
import { freePort } from "./net";
import { RoleProcess } from "./role-process";
import { describeWhere, TEST_DATABASE_URL } from "./services";
import { startSmtpServer, type TestSmtpServer } from "./smtp-server";
import { startTcpRelay, type TcpRelay } from "./tcp-relay";
import { waitUntil } from "./delivery-stack";

export type Role = "gateway" | "dispatcher" | "notifier";
export type { DeliveryFigures, EmailFigures };

/** `describe` for a cluster suite: it needs PostgreSQL and a nats-server binary (describeWhere). */
export function describeCluster(name: string, body: () => void): void {
	describeWhere({ postgres: true, programs: { [`nats-server at ${NATS_SERVER_BIN}`]: fs.existsSync(NATS_SERVER_BIN) } })(name, body);
}

const ROLE_SERVICES: Record<Role, string> = {
	gateway: "api,topics,webhooks,users",
	dispatcher: "dispatcher",
	notifier: "notifier",
};

/** Short schedules so that faults and retries play out in seconds; real values are minutes. */
export const FAST_CLUSTER_ENV: Record<string, string> = {
	DELIVERY_RETRY_SCHEDULE: "1s,2s,3s,4s,5s",
	DELIVERY_POLL_INTERVAL: "100ms",
	DELIVERY_TIMEOUT: "5s",
	DELIVERY_LEASE: "10s",
	MAIL_POLL_INTERVAL: "100ms",
	MAIL_LEASE: "5s",
	MAIL_SEND_TIMEOUT: "5s",
	MAIL_RETRY_SCHEDULE: "500ms,1s,2s,3s,4s",
	RATE_LIMIT_PER_MINUTE: "100000",
	// An event handed to a dispatcher that died comes back to the group after this, not 60 s.
	INTAKE_ACK_WAIT: "5s",
};

export interface ClusterOptions {
	/** Names the namespace, schema and log directory, for finding a failed test's logs. */
	label: string;
	/** Put a TCP relay in front of PostgreSQL for the roles, so that the test can cut it. */
	databaseRelay?: boolean;
	/** Extra environment for every role (after FAST_CLUSTER_ENV). */
	env?: Record<string, string>;
	/** The receiver's default answer (200 "ok" otherwise). */
	respond?: ScriptedResponse | Responder;
	/**
	 * NATS over mutual TLS, with certificates of the test's own CA: the roles get NATS_CA_FILE,
	 * NATS_CERT_FILE and NATS_KEY_FILE. Unset: plain NATS.
	 */
	natsTls?: boolean;
}

export interface RequestOptions {
	token?: string;
	body?: unknown;
	headers?: Record<string, string>;
}

export interface HttpAnswer {
	status: number;
	headers: Headers;
	body: any;
	text: string;
}

export interface ClusterWebhook {
	id: string;
	secret: string;
	url: string;
	/** The receiver path this webhook delivers to. */
	path: string;
	customer: string;
}

/** A producer's attempts at one send before it gives up (and the test fails). */
const SEND_ATTEMPTS = 20;

/** waitUntil with the longer bound a cluster of processes needs. */
export function eventually<T>(read: () => T | Promise<T>, done: (value: T) => boolean, what: string, boundMs = 60_000): Promise<T> {
	return waitUntil(read, done, what, boundMs);
}

export interface EventPlan {
	customer: string;
	/** Users the events cycle through (the owner of each order). */
	users: string[];
	/** Prefix of the order ids, unique per batch so that batches can be told apart. */
	prefix: string;
}

/** `count` events with fresh event_ids, cycling through the users and every order status. */
export function orderEvents(count: number, plan: EventPlan): TaskingOrderStatusInput[] {
	return Array.from({ length: count }, (_, index) => ({
		event_id: crypto.randomUUID(),
		customer_id: plan.customer,
		user_id: plan.users[index % plan.users.length],
		order_id: `${plan.prefix}-${index}`,
		status: ORDER_STATUSES[index % ORDER_STATUSES.length],
		previous_status: "staged",
	}));
}

/** The events that must produce an email to `user` (who opted in). */
export function emailWorthy(events: TaskingOrderStatusInput[], user: string): TaskingOrderStatusInput[] {
	return events.filter(event => event.user_id === user && EMAIL_STATUSES.has(String(event.status).toLowerCase() as OrderStatus));
}

export class Cluster {
	readonly namespace: string;
	readonly schema: string;
	readonly root: string;
	readonly roles = new Map<string, RoleProcess>();
	readonly jwtSecret = crypto.randomBytes(32).toString("base64url");
	readonly secretsKey = crypto.randomBytes(32).toString("base64");
	nats!: NatsServer;
	/** TRANSPORTER, and with natsTls the TLS files, as every role and the test's own clients get them. */
	natsEnv!: NatsEnv;
	relay: TcpRelay | undefined;
	receiver!: HttpsReceiver;
	smtp!: TestSmtpServer;
	caFile!: string;
	/** A direct connection to the cluster's schema (never through the relay), for assertions. */
	db!: Knex;
	private readonly producers: ServiceBroker[] = [];
	/** Other things to close with the cluster (watching connections). */
	private readonly closers: Array<() => Promise<unknown>> = [];
	private readonly scripts = new Map<string, { answers: Array<ScriptedResponse | Responder>; fallback: ScriptedResponse | Responder }>();
	private webhookCounter = 0;
	/** Each user's customer, as their tokens said (for events that name only the user). */
	private readonly userCustomers = new Map<string, string>();
	/** Sends to the channel that were rejected and made again (see send()). */
	sendRetries = 0;
	/** Events stored in JetStream so far, across every send() (to say where a fault landed). */
	sentSoFar = 0;
	private closed = false;

	private constructor(readonly options: ClusterOptions) {
		const suffix = crypto.randomBytes(3).toString("hex");
		this.namespace = `${options.label}-${suffix}`;
		this.schema = `c_${options.label.replace(/[^a-z0-9]/gi, "_").toLowerCase()}_${suffix}`;
		this.root = fs.mkdtempSync(path.join(os.tmpdir(), `swh-cluster-${options.label}-`));
	}

	static async start(options: ClusterOptions): Promise<Cluster> {
		const cluster = new Cluster(options);
		try {
			cluster.nats = await startNatsServer();
			cluster.natsEnv = { TRANSPORTER: cluster.nats.url };
			if (options.natsTls) cluster.natsEnv = await cluster.nats.startTls(path.join(cluster.root, "nats-certificates"));
			const fallback = options.respond ?? { status: 200, body: "ok" };
			cluster.receiver = await startHttpsReceiver({
				respond: request => {
					const script = cluster.scripts.get(pathOf(request));
					const next = script ? (script.answers.shift() ?? script.fallback) : fallback;
					return typeof next === "function" ? next(request) : next;
				},
			});
			cluster.caFile = cluster.receiver.writeCaFile();
			cluster.smtp = await startSmtpServer();
			if (options.databaseRelay) {
				const target = new URL(TEST_DATABASE_URL);
				cluster.relay = await startTcpRelay({ host: target.hostname, port: Number(target.port || 5432) });
			}
			cluster.db = knex({ client: "pg", connection: TEST_DATABASE_URL, searchPath: [cluster.schema], pool: { min: 0, max: 2 } });
		} catch (err) {
			await cluster.close();
			throw err;
		}
		return cluster;
	}

	/** nats.js's options for the test's own connections, TLS included, as a role's are made. */
	natsOptions(): NatsServerOptions {
		return natsServerOptions(this.natsEnv.TRANSPORTER, this.natsEnv);
	}

	/** The database URL the roles use: through the relay when there is one. */
	get roleDatabaseUrl(): string {
		if (!this.relay) return TEST_DATABASE_URL;
		const url = new URL(TEST_DATABASE_URL);
		url.hostname = "127.0.0.1";
		url.port = String(this.relay.port);
		return url.toString();
	}

	role(name: string): RoleProcess {
		const found = this.roles.get(name);
		if (!found) throw new Error(`no role named ${name}`);
		return found;
	}

	get gateway(): RoleProcess {
		return this.role("gateway");
	}

	/** Creates and starts a role process (not waiting for it; see startRoles). */
	async spawnRole(role: Role, name: string, env: Record<string, string> = {}): Promise<RoleProcess> {
		if (this.closed) throw new Error("the cluster is closed");
		if (this.roles.has(name)) throw new Error(`a role named ${name} exists already`);
		const dataDir = path.join(this.root, name);
		fs.mkdirSync(dataDir, { recursive: true });
		const port = await freePort();
		const opsPort = await freePort();
		// Each role gets only what it needs, as an operator would configure it: a dispatcher or a
		// notifier that still demanded the gateway's AUTH_JWT_SECRET would fail to start here.
		const roleSpecific: Record<Role, Record<string, string>> = {
			gateway: { AUTH_JWT_SECRET: this.jwtSecret, SECRETS_KEY: this.secretsKey, WEBHOOK_ALLOW_NETS: "127.0.0.1/32" },
			dispatcher: { WEBHOOK_ALLOW_NETS: "127.0.0.1/32", WEBHOOK_CA_FILE: this.caFile },
			notifier: {
				SECRETS_KEY: this.secretsKey,
				SMTP_URL: this.smtp.url,
				// Email links point at the gateway.
				PUBLIC_BASE_URL: `http://127.0.0.1:${this.roles.get("gateway")?.env.PORT ?? port}`,
			},
		};
		const roleEnv: Record<string, string> = {
			PATH: process.env.PATH ?? "",
			NODE_ENV: "production",
			HOST: "127.0.0.1",
			PORT: String(port),
			OPS_PORT: String(opsPort),
			DATA_DIR: dataDir,
			LOG_LEVEL: "info",
			...this.natsEnv,
			NAMESPACE: this.namespace,
			NODE_ID: `${this.namespace}-${name}`,
			SERVICES: ROLE_SERVICES[role],
			DATABASE_URL: this.roleDatabaseUrl,
			DATABASE_SCHEMA: this.schema,
			...roleSpecific[role],
			...FAST_CLUSTER_ENV,
			...this.options.env,
			...env,
		};
		const process_ = new RoleProcess(name, roleEnv, path.join(this.root, `${name}.log`));
		this.roles.set(name, process_);
		process_.start();
		return process_;
	}

	/** Starts roles side by side and waits until every one answers /health with 200. */
	async startRoles(...specs: Array<[Role, string] | [Role, string, Record<string, string>]>): Promise<RoleProcess[]> {
		const started: RoleProcess[] = [];
		for (const [role, name, env] of specs) started.push(await this.spawnRole(role, name, env));
		await Promise.all(started.map(process_ => process_.waitHealthy()));
		return started;
	}

	/** Starts a stopped role again with the same environment (ports, node id) and waits for it. */
	async restart(name: string): Promise<RoleProcess> {
		// A test body that outlived its timeout must not start processes after close().
		if (this.closed) throw new Error("the cluster is closed");
		const process_ = this.role(name);
		process_.start();
		await process_.waitHealthy();
		return process_;
	}

	token(sub: string, claims: { customer?: string; email?: string; name?: string; scope?: string } = {}): Promise<string> {
		// As the gateway does: the customer claim, or the user's own (implicit) customer.
		this.userCustomers.set(sub, claims.customer ?? implicitCustomerId(sub));
		return mintToken(parseConfig({ AUTH_JWT_SECRET: this.jwtSecret }), { sub, ...claims });
	}

	get apiUrl(): string {
		return `http://127.0.0.1:${this.gateway.env.PORT}`;
	}

	async request(method: string, urlPath: string, options: RequestOptions = {}): Promise<HttpAnswer> {
		const headers: Record<string, string> = { ...options.headers };
		if (options.token) headers.authorization = `Bearer ${options.token}`;
		let body: string | undefined;
		if (typeof options.body === "string") body = options.body;
		else if (options.body !== undefined) {
			body = JSON.stringify(options.body);
			headers["content-type"] ??= "application/json";
		}
		const response = await fetch(this.apiUrl + urlPath, { method, headers, body, signal: AbortSignal.timeout(60_000) });
		const text = await response.text();
		let parsed: unknown;
		try {
			parsed = text ? JSON.parse(text) : undefined;
		} catch {
			parsed = text;
		}
		return { status: response.status, headers: response.headers, body: parsed, text };
	}

	/** Creates a webhook through the API, delivering to its own path on the receiver. */
	async createWebhook(token: string, customer: string): Promise<ClusterWebhook> {
		const hookPath = `/hooks/${++this.webhookCounter}`;
		const response = await this.request("POST", "/id/v3/webhooks", {
			token,
			body: { name: `hook ${this.webhookCounter}`, url: this.receiver.url + hookPath, events: ["tasking:order_status"] },
		});
		if (response.status !== 201) throw new Error(`webhook creation failed: ${response.status} ${response.text}`);
		return { id: response.body.id, secret: response.body.secret, url: response.body.url, path: hookPath, customer };
	}

	/** Scripted answers for one webhook's path, in order; then `fallback` (200 by default). */
	script(webhook: ClusterWebhook, answers: Array<ScriptedResponse | Responder>, fallback: ScriptedResponse | Responder = { status: 200, body: "ok" }): void {
		this.scripts.set(webhook.path, { answers: [...answers], fallback });
	}

	/** Turns email on for tasking:order_status, as docs/api.md shows (PUT /id/v3/user/settings). */
	async optInToEmail(token: string): Promise<void> {
		const response = await this.request("PUT", "/id/v3/user/settings", {
			token,
			body: { notifications: [{ category: "tasking", settings: [{ topic: "tasking:order_status", email: true }] }] },
		});
		if (response.status !== 200) throw new Error(`opt-in failed: ${response.status} ${response.text}`);
	}

	/**
	 * An outside producer: another team's Moleculer node in the same namespace, with the channels
	 * middleware on this cluster's JetStream. Stopped by close().
	 */
	async producer(): Promise<ServiceBroker> {
		const broker = new ServiceBroker({
			namespace: this.namespace,
			nodeID: `${this.namespace}-producer-${this.producers.length + 1}`,
			transporter: { type: "NATS", options: this.natsOptions() },
			logger: false,
			// The package's typings demand every adapter option; the object form is what DESIGN.md
			// prescribes (the string form ignores host and port).
			middlewares: [ChannelsMiddleware({ adapter: { type: "NATS", options: { nats: { connectionOptions: this.natsOptions() } } } } as never) as unknown as Middleware],
		});
		this.producers.push(broker);
		await broker.start();
		return broker;
	}

	/**
	 * Sends the events to the channel from an outside node, `concurrency` at a time. Every
	 * resolved send is stored in JetStream. A rejected send is sent again, as docs/delivery.md tells
	 * producers to: a rejection (a timeout just after NATS came back, say) does not prove the
	 * event was not stored, which is why every event carries its event_id. Returns how many
	 * events were sent; `sendRetries` counts the sends that had to be repeated. `gapMs` paces
	 * each of the `concurrency` senders, so that a fault can land while events still come in; as a
	 * function it is asked before each gap, so that a test can stop pacing once the fault is over.
	 * `publishTimeoutMs` bounds the wait for JetStream's acknowledgement of one send (nats.js: 5 s).
	 */
	async send(
		events: TaskingOrderStatusInput[],
		options: { producer?: ServiceBroker; concurrency?: number; gapMs?: number | (() => number); publishTimeoutMs?: number } = {},
	): Promise<number> {
		const broker = options.producer ?? this.producers[0] ?? (await this.producer());
		// A fresh options object per send: the channels adapter may add to the one it is given.
		const sendToChannel = (payload: unknown) =>
			(broker as unknown as { sendToChannel(name: string, payload: unknown, options?: object): Promise<void> }).sendToChannel(
				TASKING_ORDER_STATUS_EVENT,
				payload,
				options.publishTimeoutMs ? { timeout: options.publishTimeoutMs } : undefined,
			);
		const concurrency = options.concurrency ?? 50;
		let next = 0;
		let sent = 0;
		const worker = async () => {
			while (next < events.length) {
				const event = events[next++];
				for (let attempt = 1; ; attempt++) {
					try {
						await sendToChannel(event);
						break;
					} catch (err) {
						if (attempt >= SEND_ATTEMPTS) throw err;
						this.sendRetries += 1;
						await sleep(500);
					}
				}
				sent += 1;
				this.sentSoFar += 1;
				const gapMs = typeof options.gapMs === "function" ? options.gapMs() : options.gapMs;
				if (gapMs) await sleep(gapMs);
			}
		};
		await Promise.all(Array.from({ length: Math.min(concurrency, events.length) }, worker));
		return sent;
	}

	/** How many events the intake stream holds (every stored send, repeats included). */
	async streamMessages(): Promise<number> {
		const connection = await connect(this.natsOptions());
		try {
			const manager = await connection.jetstreamManager();
			return (await manager.streams.info(intakeNames(this.namespace).stream)).state.messages;
		} finally {
			await connection.close();
		}
	}

	/**
	 * Watches JetStream hand the intake to one consumer group, from the side: a plain subscriber
	 * to the group's deliver subject gets a copy of every push (it never answers, so the group
	 * is not disturbed). The reply subject of each push says how many times that event has been
	 * delivered to the group; `redelivered()` counts the events handed out more than once, which
	 * happens when an instance took an event and never acknowledged it.
	 */
	async watchIntake(group: IntakeGroup): Promise<{ redelivered(): number }> {
		const connection = await connect({ ...this.natsOptions(), name: `watch-${group}` });
		this.closers.push(() => connection.close());
		const deliveries = new Map<string, number>();
		connection.subscribe(intakeDeliverSubject(intakeNames(this.namespace), group), {
			callback: (_err, message) => {
				// $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.… (or, from newer servers,
				// with a domain and an account hash after ACK).
				const tokens = (message.reply ?? "").split(".");
				const at = tokens.length >= 11 ? 6 : 4;
				const delivered = Number(tokens[at]);
				const sequence = tokens[at + 1];
				if (sequence !== undefined && Number.isFinite(delivered)) deliveries.set(sequence, Math.max(delivered, deliveries.get(sequence) ?? 0));
			},
		});
		await connection.flush();
		return { redelivered: () => [...deliveries.values()].filter(count => count > 1).length };
	}

	/** Requests that reached one webhook's path. */
	received(webhook: ClusterWebhook): ReceivedRequest[] {
		return this.receiver.requests.filter(request => pathOf(request) === webhook.path);
	}

	/** How many distinct (webhook, order) pairs were answered 200 so far; only those in `among`, if given. */
	deliveredCount(webhooks: ClusterWebhook[], among?: Set<string>): number {
		return answeredKeyCount(this.receiver.requests, webhooks, among);
	}

	/** The (webhook, order) pairs these events must reach: each event goes to its customer's webhooks. */
	expectedKeys(webhooks: ClusterWebhook[], events: TaskingOrderStatusInput[]): string[] {
		return expectedDeliveryKeys(webhooks, events, event => event.customer_id ?? this.userCustomers.get(event.user_id));
	}

	/** Waits (bounded) until every expected delivery of these events was answered 200 (others not counted). */
	async waitForDeliveries(webhooks: ClusterWebhook[], events: TaskingOrderStatusInput[], boundMs = 120_000): Promise<void> {
		const expected = new Set(this.expectedKeys(webhooks, events));
		await eventually(() => this.deliveredCount(webhooks, expected), count => count >= expected.size, `${expected.size} deliveries`, boundMs).catch(err => {
			throw new Error(`${(err as Error).message}\n${this.logs()}`);
		});
	}

	/** What the receiver got for these webhooks and events (arrival-counts.ts says how it counts). */
	deliveryFigures(webhooks: ClusterWebhook[], events: TaskingOrderStatusInput[], sent = events.length): DeliveryFigures {
		return countDeliveries(this.receiver.requests, webhooks, events, this.expectedKeys(webhooks, events), sent);
	}

	/** What the SMTP server accepted for these events. */
	emailFigures(expectedEvents: TaskingOrderStatusInput[], allEvents: TaskingOrderStatusInput[]): EmailFigures {
		return countEmails(this.smtp.received, expectedEvents, allEvents);
	}

	/** Waits (bounded) until every expected email arrived. */
	async waitForEmails(expectedEvents: TaskingOrderStatusInput[], allEvents: TaskingOrderStatusInput[], boundMs = 120_000): Promise<void> {
		await eventually(() => this.emailFigures(expectedEvents, allEvents).lost, lost => lost === 0, `${expectedEvents.length} emails`, boundMs).catch(err => {
			throw new Error(`${(err as Error).message}\n${this.logs()}`);
		});
	}

	/** The tails of every role's log, for a failure message. */
	logs(lines = 40): string {
		return [...this.roles.values()].map(role => role.tail(lines)).join("\n");
	}

	/** Stops everything this cluster started, whatever state the test left it in. */
	async close(): Promise<void> {
		this.closed = true;
		const step = async (what: string, action: () => Promise<unknown> | undefined) => {
			try {
				await action();
			} catch (err) {
				console.warn(`cluster ${this.namespace}: ${what} failed while closing: ${(err as Error).message}`);
			}
		};
		await Promise.all([...this.roles.values()].map(role => step(`killing ${role.name}`, () => role.kill("SIGKILL"))));
		for (const producer of this.producers) await step("stopping a producer", () => withBound(producer.stop(), 10_000));
		for (const closer of this.closers) await step("closing a watch", closer);
		await step("closing the relay", () => this.relay?.close());
		await step("stopping NATS", () => this.nats?.close());
		await step("closing the receiver", () => this.receiver?.close());
		await step("closing the SMTP server", () => this.smtp?.close());
		if (this.db) {
			await step("dropping the schema", () => this.db.raw(`DROP SCHEMA IF EXISTS "${this.schema}" CASCADE`));
			await step("closing the database", () => this.db.destroy());
		}
		if (process.env.KEEP_CLUSTER_LOGS) console.warn(`cluster ${this.namespace}: logs kept in ${this.root}`);
		else fs.rmSync(this.root, { recursive: true, force: true });
	}
}

function withBound<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
	let timer: NodeJS.Timeout | undefined;
	return Promise.race([promise, new Promise<undefined>(resolve => (timer = setTimeout(() => resolve(undefined), ms)))]).finally(() => clearTimeout(timer));
}

/**
 * Runs a test body; on failure prints the tail of every role's log before rethrowing, since a
 * cluster failure is rarely explained by the assertion alone.
 */
export async function withClusterLogs<T>(cluster: Cluster | undefined, body: () => Promise<T>): Promise<T> {
	try {
		return await body();
	} catch (err) {
		if (cluster) console.error(`cluster ${cluster.namespace} failed; role logs:\n${cluster.logs(80)}`);
		throw err;
	}
}

/** One line of JSON per test, the figures the issue asks for. */
export function printFigures(test: string, figures: object): void {
	console.log(`cluster figures ${JSON.stringify({ test, ...figures })}`);
}
