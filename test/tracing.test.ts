// OpenTelemetry traces in the embedded mode, on both engines: `server.ts` as `npm start` runs
// it (a real process: the OTLP exporter loads node:http with a dynamic import, which jest's
// module sandbox refuses), its real exporter sending to a receiver started here
// (test/helpers/otlp-receiver.ts), in JSON and in protobuf. One event posted to the HTTP intake
// is one trace, from the caller's traceparent through the gateway, the dispatcher's intake and
// the notifier's, to every attempt and the email; a retry made after a restart, from the context
// stored with the message, joins it too. Without an endpoint no OpenTelemetry module is loaded
// at all. The cluster is cluster-tracing.test.ts.
import { spawn } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import knex, { type Knex } from "knex";
import { ConfigError, parseConfig } from "../lib/config";
import { mintToken } from "../lib/auth";
import { roleName, tracingSettings } from "../lib/tracing";
import { waitUntil } from "./helpers/delivery-stack";
import { startHttpsReceiver, type HttpsReceiver, type ScriptedResponse } from "./helpers/https-receiver";
import { freePort } from "./helpers/net";
import { startOtlpReceiver, type OtlpReceiver, type ReceivedSpan } from "./helpers/otlp-receiver";
import { RoleProcess } from "./helpers/role-process";
import { TEST_DATABASE_URL, testDatabases, type DatabaseKind } from "./helpers/services";

const INTAKE = "/id/v3/events/tasking.order_status";
const ROOT = path.resolve(__dirname, "..");
const SPAN_KIND = { internal: 1, server: 2, client: 3, producer: 4, consumer: 5 } as const;
const STATUS_ERROR = 2;

const hex = (bytes: number) => crypto.randomBytes(bytes).toString("hex");

const attemptsIn = (spans: ReceivedSpan[]) => spans.filter(span => span.name === "webhook attempt").sort((a, b) => Number(a.attributes["webhook.attempt"]) - Number(b.attributes["webhook.attempt"]));

describe("tracing configuration", () => {
	const base = { NODE_ENV: "test", DATA_DIR: os.tmpdir() };

	it("is off without an endpoint, and takes the standard variables with the role as the default service name", () => {
		expect(tracingSettings(parseConfig(base))).toBeNull();
		expect(tracingSettings(parseConfig({ ...base, OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318/" }))).toEqual({
			url: "http://collector:4318/v1/traces",
			protocol: "http/protobuf",
			serviceName: "all",
			sampler: "parentbased_always_on",
			samplerRatio: 1,
		});
		expect(
			tracingSettings(
				parseConfig({
					...base,
					SERVICES: "dispatcher",
					OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318",
					OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "https://traces.example.com/otlp/v1/traces",
					OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf",
					OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "http/json",
					OTEL_TRACES_SAMPLER: "parentbased_traceidratio",
					OTEL_TRACES_SAMPLER_ARG: "0.25",
				}),
			),
		).toEqual({ url: "https://traces.example.com/otlp/v1/traces", protocol: "http/json", serviceName: "dispatcher", sampler: "parentbased_traceidratio", samplerRatio: 0.25 });
		expect(tracingSettings(parseConfig({ ...base, OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_SERVICE_NAME: "webhooks-eu" }))?.serviceName).toBe("webhooks-eu");
		expect(roleName(["api", "topics", "webhooks", "users"])).toBe("api,topics,webhooks,users");
	});

	it.each([
		["OTEL_EXPORTER_OTLP_ENDPOINT", "not a url", "is not a URL"],
		["OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://collector:4318", "http:// or https://"],
		["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://user:secret@collector/v1/traces", "must not carry credentials"],
		["OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "gRPC is not supported"],
		["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/xml", "http/protobuf or http/json"],
		["OTEL_TRACES_SAMPLER", "sometimes", "must be one of"],
		["OTEL_TRACES_SAMPLER_ARG", "1.5", "not a sampling ratio"],
		["OTEL_TRACES_SAMPLER_ARG", "-0.1", "not a sampling ratio"],
		["OTEL_TRACES_SAMPLER_ARG", "half", "not a sampling ratio"],
		["OTEL_SERVICE_NAME", "x".repeat(201), "200"],
	])("refuses %s=%s, naming it", (name, value, message) => {
		let error: unknown;
		try {
			parseConfig({ ...base, [name]: value });
		} catch (err) {
			error = err;
		}
		expect(error).toBeInstanceOf(ConfigError);
		expect((error as Error).message).toMatch(new RegExp(`${name}: .*${message.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")}`));
		// The secret of a URL with credentials is not repeated in the message.
		expect((error as Error).message).not.toContain("secret@");
	});
});

describe("tracing off, in an embedded node", () => {
	it("loads no module of the OpenTelemetry SDK and adds no middleware, serving requests as before; nor nats.js and the channels, which only a cluster node uses", async () => {
		const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-tracing-off-"));
		const script = `
			const { createApp } = require("./app");
			const { parseConfig, resolveSecrets } = require("./lib/config");
			// What server.ts adds to the app before it starts: the wait for NATS and PostgreSQL.
			require("./lib/startup-dependencies");
			const config = parseConfig({ NODE_ENV: "test", PORT: "0", HOST: "127.0.0.1", DATA_DIR: ${JSON.stringify(dataDir)}, LOG_LEVEL: "warn" });
			resolveSecrets(config);
			const app = createApp(config, { broker: { logger: false } });
			app.start().then(async () => {
				const response = await fetch("http://127.0.0.1:" + app.apiPort() + "/id/v3/events/tasking.order_status", { method: "POST", body: "{}", headers: { "content-type": "application/json", traceparent: "00-${hex(16)}-${hex(8)}-01" } });
				await app.stop();
				process.stdout.write(JSON.stringify({
					status: response.status,
					middlewares: app.broker.middlewares.list.map(middleware => middleware.name),
					// @opentelemetry/api itself is loaded by prom-client (exemplars) whatever we do.
					opentelemetry: Object.keys(require.cache).filter(file => (file.includes("opentelemetry") && !file.includes("/@opentelemetry/api/")) || file.includes("tracing-sdk")),
					clusterOnly: Object.keys(require.cache).filter(file => /node_modules\\/(nats|@moleculer\\/channels)\\/|intake-jetstream/.test(file)),
				}));
			});
		`;
		const output = await new Promise<string>((resolve, reject) => {
			const child = spawn(process.execPath, ["--import", "tsx", "-e", script], { cwd: ROOT, env: { PATH: process.env.PATH ?? "" } });
			let stdout = "";
			let stderr = "";
			child.stdout.on("data", chunk => (stdout += chunk));
			child.stderr.on("data", chunk => (stderr += chunk));
			child.on("exit", code => (code === 0 ? resolve(stdout) : reject(new Error(`exit ${code}: ${stderr}`))));
		});
		fs.rmSync(dataDir, { recursive: true, force: true });
		const result = JSON.parse(output);
		expect(result.status).toBe(401);
		expect(result.middlewares).not.toContain("OpenTelemetry");
		expect(result.opentelemetry).toEqual([]);
		expect(result.clusterOnly).toEqual([]);
	}, 60_000);
});

/** The embedded service as a process of its own, with what a test needs to talk to it. */
class EmbeddedServer {
	readonly jwtSecret = crypto.randomBytes(32).toString("base64url");
	readonly dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-tracing-"));
	readonly schema: string | undefined;
	role!: RoleProcess;
	db!: Knex;

	constructor(readonly database: DatabaseKind) {
		this.schema = database === "postgres" ? `t_trace_${crypto.randomBytes(5).toString("hex")}` : undefined;
	}

	async start(receiver: HttpsReceiver, env: Record<string, string>): Promise<this> {
		this.role = new RoleProcess("embedded", {
			PATH: process.env.PATH ?? "",
			NODE_ENV: "test",
			HOST: "127.0.0.1",
			PORT: String(await freePort()),
			OPS_PORT: String(await freePort()),
			DATA_DIR: this.dataDir,
			LOG_LEVEL: "warn",
			AUTH_JWT_SECRET: this.jwtSecret,
			RATE_LIMIT_PER_MINUTE: "100000",
			WEBHOOK_ALLOW_NETS: "127.0.0.0/8",
			WEBHOOK_CA_FILE: receiver.writeCaFile(),
			DELIVERY_RETRY_SCHEDULE: "1s,2s,3s",
			DELIVERY_POLL_INTERVAL: "100ms",
			MAIL_POLL_INTERVAL: "100ms",
			// The SDK's own variable: spans leave within 100 ms rather than 5 s.
			OTEL_BSP_SCHEDULE_DELAY: "100",
			...(this.schema ? { DATABASE_URL: TEST_DATABASE_URL, DATABASE_SCHEMA: this.schema } : {}),
			...env,
		}, path.join(this.dataDir, "server.log"));
		this.role.start();
		await this.role.waitHealthy();
		this.db = this.schema
			? knex({ client: "pg", connection: TEST_DATABASE_URL, searchPath: [this.schema], pool: { min: 0, max: 2 } })
			: knex({ client: "better-sqlite3", connection: { filename: path.join(this.dataDir, "service.sqlite") }, useNullAsDefault: true });
		return this;
	}

	/** Stops the process (SIGTERM, as an operator would) and starts it again on the same data. */
	async restart(): Promise<void> {
		expect((await this.role.terminate()).killedAfterBound).toBe(false);
		this.role.start();
		await this.role.waitHealthy();
	}

	token(sub: string, claims: { customer?: string; email?: string; scope?: string } = {}): Promise<string> {
		return mintToken(parseConfig({ AUTH_JWT_SECRET: this.jwtSecret }), { sub, ...claims });
	}

	async request(method: string, urlPath: string, options: { token?: string; body?: unknown; headers?: Record<string, string> } = {}): Promise<{ status: number; body: any }> {
		const response = await fetch(`http://127.0.0.1:${this.role.env.PORT}${urlPath}`, {
			method,
			headers: { ...(options.token ? { authorization: `Bearer ${options.token}` } : {}), ...(options.body === undefined ? {} : { "content-type": "application/json" }), ...options.headers },
			body: options.body === undefined ? undefined : JSON.stringify(options.body),
		});
		const text = await response.text();
		return { status: response.status, body: text ? JSON.parse(text) : null };
	}

	/** A customer whose user is signed in (with an address) and, if asked, wants the email. */
	async customer(options: { email?: boolean } = {}): Promise<{ id: string; userId: string; token: string }> {
		const id = `cust-${crypto.randomBytes(4).toString("hex")}`;
		const userId = `user-${id}`;
		const token = await this.token(userId, { customer: id, email: `${userId}@example.com` });
		expect((await this.request("GET", "/id/v3/user/details", { token })).status).toBe(200);
		if (options.email) {
			const settings = { notifications: [{ category: "tasking", settings: [{ topic: "tasking:order_status", email: true }] }] };
			expect((await this.request("PUT", "/id/v3/user/settings", { token, body: settings })).status).toBe(200);
		}
		return { id, userId, token };
	}

	async webhook(token: string, receiver: HttpsReceiver, webhookPath: string): Promise<{ id: string; url: string; path: string }> {
		const created = await this.request("POST", "/id/v3/webhooks", { token, body: { name: "traced", url: receiver.url + webhookPath, events: ["tasking:order_status"] } });
		expect(created.status).toBe(201);
		return { id: created.body.id, url: created.body.url, path: webhookPath };
	}

	async stop(): Promise<void> {
		await this.role?.terminate();
		if (this.schema) await this.db?.raw(`DROP SCHEMA IF EXISTS "${this.schema}" CASCADE`);
		await this.db?.destroy();
		fs.rmSync(this.dataDir, { recursive: true, force: true });
	}
}

const orderEvent = (customer: { id: string; userId: string }, status = "fulfilled") => ({
	event_id: crypto.randomUUID(),
	customer_id: customer.id,
	user_id: customer.userId,
	order_id: `order-${crypto.randomBytes(4).toString("hex")}`,
	status,
});

/** Waits until the receiver holds what `done` wants of the trace. */
function traceOf(receiver: OtlpReceiver, traceId: string, done: (spans: ReceivedSpan[]) => boolean, what: string): Promise<ReceivedSpan[]> {
	return waitUntil(() => receiver.spans.filter(span => span.traceId === traceId), done, what, 60_000);
}

/** The trace id the service stored with the event's message. */
async function storedTraceId(server: EmbeddedServer, eventId: string): Promise<string> {
	const [message] = await waitUntil(() => server.db("delivery_messages").where({ event_id: eventId }), rows => rows.length === 1, "the event to be stored");
	return String(message.trace_context).split("-")[1];
}

/** Answers each path's first request with `first`, and every later one with 200. */
function firstAnswerPerPath(first: ScriptedResponse): (request: { path: string }) => ScriptedResponse {
	const seen = new Set<string>();
	return request => {
		if (seen.has(request.path)) return { status: 200, body: "ok" };
		seen.add(request.path);
		return first;
	};
}

describe.each(testDatabases())("tracing, embedded (%s)", database => {
	let otlp: OtlpReceiver;
	let receiver: HttpsReceiver;
	let server: EmbeddedServer;
	let producer: string;

	beforeAll(async () => {
		otlp = await startOtlpReceiver();
		receiver = await startHttpsReceiver({ respond: firstAnswerPerPath({ status: 500, body: "not yet" }) });
		server = await new EmbeddedServer(database).start(receiver, { OTEL_EXPORTER_OTLP_ENDPOINT: otlp.url, OTEL_EXPORTER_OTLP_PROTOCOL: "http/json" });
		producer = await server.token("orders-service", { scope: "events:publish" });
	}, 120_000);
	afterAll(async () => {
		await server?.stop();
		await receiver?.close();
		await otlp?.close();
	});

	it("follows one event from the caller's traceparent to every attempt and the email, and a retry after a restart joins it (JSON)", async () => {
		const customer = await server.customer({ email: true });
		const webhook = await server.webhook(customer.token, receiver, "/hooks/joined");
		const callerTrace = hex(16);
		const callerSpan = hex(8);
		const event = orderEvent(customer);
		const posted = await server.request("POST", INTAKE, { token: producer, body: event, headers: { traceparent: `00-${callerTrace}-${callerSpan}-01` } });
		expect(posted.status).toBe(202);
		// Start-up said where the traces go.
		expect(fs.readFileSync(server.role.logFile, "utf8")).toContain(`Traces   ${otlp.url} (http/json, service.name all, sampler parentbased_always_on)`);

		// The first attempt is answered 500, the retry 200.
		const firstRun = await traceOf(otlp, callerTrace, spans => attemptsIn(spans).length === 2 && spans.some(span => span.name === "email send"), "two attempts and the email in the caller's trace");
		const http = firstRun.find(span => span.kind === SPAN_KIND.server && span.name === `POST ${INTAKE}`)!;
		expect(http).toMatchObject({ parentSpanId: callerSpan, serviceName: "all", encoding: "json", attributes: expect.objectContaining({ "http.route": INTAKE, "http.response.status_code": 202 }) });
		const byId = new Map(firstRun.map(span => [span.spanId, span]));
		const publish = firstRun.find(span => span.name === "dispatcher.publish")!;
		// The gateway's action, then the dispatcher's intake, each under the one before.
		expect(byId.get(publish.parentSpanId)?.name).toBe("api.publishOrderStatus");
		expect(byId.get(byId.get(publish.parentSpanId)!.parentSpanId)).toBe(http);

		const [delivery] = await server.db("deliveries").where({ event_id: event.event_id });
		const [message] = await server.db("delivery_messages").where({ event_id: event.event_id });
		expect(message.trace_context).toBe(`00-${callerTrace}-${publish.spanId}-01`);
		const [first, second] = attemptsIn(firstRun);
		for (const attempt of [first, second]) {
			expect(attempt).toMatchObject({ kind: SPAN_KIND.client, parentSpanId: publish.spanId });
			expect(attempt.attributes).toMatchObject({ "webhook.id": webhook.id, "webhook.delivery.id": delivery.id, "server.address": new URL(webhook.url).hostname, "http.request.method": "POST" });
			// The span lasts what the sender measured.
			expect(attempt.endMs - attempt.startMs).toBe(attempt.attributes["webhook.duration_ms"]);
		}
		expect(first.attributes).toMatchObject({ "webhook.attempt": 1, "http.response.status_code": 500, "error.type": "500", "webhook.error_kind": "http_status" });
		expect(first.statusCode).toBe(STATUS_ERROR);
		expect(second.attributes).toMatchObject({ "webhook.attempt": 2, "http.response.status_code": 200 });
		expect(second.attributes["error.type"]).toBeUndefined();
		// The URL's host only: its path is in no span of the trace.
		for (const span of firstRun) for (const value of Object.values(span.attributes)) expect(String(value)).not.toContain(webhook.path);

		const [outbox] = await server.db("email_outbox").where({ event_id: event.event_id });
		const email = firstRun.find(span => span.name === "email send")!;
		expect(byId.get(email.parentSpanId)?.name).toBe("notifier.accept");
		expect(email.attributes).toMatchObject({ "email.outbox_id": outbox.id, "email.attempt": 1, "email.result": "sent", "smtp.response": expect.stringContaining("written to") });

		// A new process on the same data, nothing of the first in memory: a retry asked for now
		// (hours later, in production) reads the context stored with the message.
		await server.restart();
		const retried = await server.request("POST", `/id/v3/webhooks/${webhook.id}/deliveries/${delivery.id}/retry`, { token: customer.token });
		expect(retried.status).toBe(202);
		const afterRestart = await traceOf(otlp, callerTrace, spans => attemptsIn(spans).length === 3, "the third attempt in the event's trace");
		expect(attemptsIn(afterRestart)[2]).toMatchObject({ parentSpanId: publish.spanId, attributes: expect.objectContaining({ "webhook.attempt": 3, "webhook.delivery.id": delivery.id, "http.response.status_code": 200 }) });
	}, 120_000);

	it("starts a new trace for a request without a valid traceparent, whatever the header holds", async () => {
		const customer = await server.customer();
		await server.webhook(customer.token, receiver, "/hooks/hostile");
		const hostile = [
			"garbage",
			`00-${"0".repeat(32)}-${hex(8)}-01`,
			`00-${hex(16)}-${"0".repeat(16)}-01`,
			`ff-${hex(16)}-${hex(8)}-01`,
			`00-${hex(16).toUpperCase()}-${hex(8)}-01`,
			`00-${hex(16)}-${hex(8)}-01-extra`,
			"x".repeat(8_000),
		];
		for (const traceparent of hostile) {
			const event = orderEvent(customer, "in progress");
			const posted = await server.request("POST", INTAKE, { token: producer, body: event, headers: { traceparent, tracestate: "a=".repeat(2_000) } });
			expect(posted.status).toBe(202);
			const traceId = await storedTraceId(server, event.event_id);
			expect(traceparent.toLowerCase()).not.toContain(traceId);
			const spans = await traceOf(otlp, traceId, found => found.some(span => span.kind === SPAN_KIND.server), "the request's own trace");
			// A root: the header named no parent it could be joined to.
			expect(spans.find(span => span.kind === SPAN_KIND.server)?.parentSpanId).toBe("");
		}
	}, 120_000);
});

describe("tracing, embedded, protobuf and sampling", () => {
	let otlp: OtlpReceiver;
	let receiver: HttpsReceiver;
	let server: EmbeddedServer | undefined;
	beforeAll(async () => {
		otlp = await startOtlpReceiver();
		receiver = await startHttpsReceiver();
	});
	afterEach(async () => {
		await server?.stop();
		server = undefined;
	});
	afterAll(async () => {
		await receiver?.close();
		await otlp?.close();
	});

	it("exports in protobuf (http/protobuf), decoded with the OTLP definitions", async () => {
		server = await new EmbeddedServer("sqlite").start(receiver, { OTEL_EXPORTER_OTLP_ENDPOINT: otlp.url, OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf", OTEL_SERVICE_NAME: "webhooks-test" });
		const producer = await server.token("orders-service", { scope: "events:publish" });
		const customer = await server.customer();
		const webhook = await server.webhook(customer.token, receiver, "/hooks/protobuf");
		const event = orderEvent(customer);
		expect((await server.request("POST", INTAKE, { token: producer, body: event })).status).toBe(202);
		const spans = await traceOf(otlp, await storedTraceId(server, event.event_id), found => attemptsIn(found).length === 1, "the attempt");
		expect(spans.every(span => span.encoding === "protobuf" && span.serviceName === "webhooks-test")).toBe(true);
		expect(spans.find(span => span.kind === SPAN_KIND.server && span.name === `POST ${INTAKE}`)?.parentSpanId).toBe("");
		expect(attemptsIn(spans)[0].attributes).toMatchObject({ "webhook.id": webhook.id, "webhook.attempt": 1, "http.response.status_code": 200 });
		expect(otlp.rejected).toEqual([]);
	}, 120_000);

	it("exports nothing at a sampling ratio of 0, and still stores the (unsampled) context", async () => {
		server = await new EmbeddedServer("sqlite").start(receiver, { OTEL_EXPORTER_OTLP_ENDPOINT: otlp.url, OTEL_TRACES_SAMPLER: "traceidratio", OTEL_TRACES_SAMPLER_ARG: "0" });
		const producer = await server.token("orders-service", { scope: "events:publish" });
		const customer = await server.customer();
		await server.webhook(customer.token, receiver, "/hooks/unsampled");
		const event = orderEvent(customer);
		expect((await server.request("POST", INTAKE, { token: producer, body: event })).status).toBe(202);
		await waitUntil(() => server!.db("deliveries").where({ event_id: event.event_id, status: "succeeded" }), rows => rows.length === 1, "the delivery to be recorded");
		const traceId = await storedTraceId(server, event.event_id);
		// Stopped with SIGTERM, the node exports whatever it had: nothing, here.
		await server.role.terminate();
		expect(otlp.spans.filter(span => span.traceId === traceId)).toEqual([]);
		const [message] = await server.db("delivery_messages").where({ event_id: event.event_id });
		expect(message.trace_context).toMatch(/^00-[0-9a-f]{32}-[0-9a-f]{16}-00$/);
	}, 120_000);
});
