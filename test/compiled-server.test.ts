// Production runs compiled JavaScript: `npm run build` compiles the service into dist/, and
// `node dist/server.js` (the image's command) runs it from a directory laid out like the image,
// with no TypeScript source beside it. Over a real NATS (as a container runs), it serves the web
// app, takes a webhook and an email preference, and turns an event from the durable channel
// into a signed HTTPS delivery (sent from the compiled sender thread) and an email over SMTP,
// then stops cleanly on SIGTERM. On SQLite and PostgreSQL.
//
// The Node 24 smoke suite (.ci/node-lts-smoke) runs this file under that Node too; it sets
// SMOKE_NODE_MAJOR so that the suite cannot silently run on another version.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { ServiceBroker, type Middleware } from "moleculer";
import { Middleware as ChannelsMiddleware } from "@moleculer/channels";
import { verifyWebhook } from "@satellite-webhooks/sdk";
import { ensureBuilt, imageLayout, type ImageLayout } from "./helpers/compiled-build";
import { startHttpsReceiver, type HttpsReceiver } from "./helpers/https-receiver";
import { startSmtpServer, type TestSmtpServer } from "./helpers/smtp-server";
import { freePort } from "./helpers/net";
import { describeWhere, dropTestSchema, TEST_DATABASE_URL, TEST_NATS_URL, testDatabases } from "./helpers/services";
import { waitUntil } from "./helpers/delivery-stack";
import { dropIntakeStreams } from "../lib/intake-jetstream";
import { TASKING_ORDER_STATUS_EVENT } from "../lib/schemas/events";
import { implicitCustomerId } from "../lib/customers";

const JWT_SECRET = "c".repeat(48);
const SECRETS_KEY = Buffer.alloc(32, 9).toString("base64");
const describeWithNats = describeWhere({ nats: true });

jest.setTimeout(180_000);

it("runs on the Node version the smoke suite asked for", () => {
	const wanted = process.env.SMOKE_NODE_MAJOR;
	expect(process.versions.node.split(".")[0]).toBe(wanted ?? process.versions.node.split(".")[0]);
});

describeWithNats.each(testDatabases())("the compiled server (node dist/server.js) on %s", database => {
	let layout: ImageLayout;
	let receiver: HttpsReceiver;
	let smtp: TestSmtpServer;
	let server: ChildProcess;
	let output = "";
	let exited: Promise<number | null>;
	let producer: ServiceBroker;
	let env: Record<string, string>;
	let baseUrl: string;
	let opsUrl: string;
	const namespace = `compiled-${database}-${process.pid}`;
	const schema = `compiled_${process.pid}`;
	const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-compiled-"));

	/** The compiled token script, as an operator would run it inside the image. */
	const token = (sub: string, email: string) => {
		const result = spawnSync(process.execPath, ["dist/scripts/token.js", "--sub", sub, "--email", email], { cwd: layout.dir, env: { ...process.env, ...env }, encoding: "utf8" });
		if (result.status !== 0) throw new Error(`token script failed: ${result.stderr}`);
		return result.stdout.trim();
	};
	const api = async (method: string, route: string, bearer: string, body?: unknown) => {
		const response = await fetch(`${baseUrl}/id/v3${route}`, {
			method,
			headers: { authorization: `Bearer ${bearer}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
			body: body === undefined ? undefined : JSON.stringify(body),
		});
		return { status: response.status, body: (await response.json().catch(() => null)) as any };
	};

	beforeAll(async () => {
		// `npm run build` once per run, here or in entrypoint.test.ts, whichever comes first.
		await ensureBuilt();
		layout = imageLayout();
		receiver = await startHttpsReceiver();
		smtp = await startSmtpServer();
		const [port, opsPort] = [await freePort(), await freePort()];
		baseUrl = `http://127.0.0.1:${port}`;
		opsUrl = `http://127.0.0.1:${opsPort}`;
		env = {
			NODE_ENV: "production",
			HOST: "127.0.0.1",
			PORT: String(port),
			OPS_PORT: String(opsPort),
			DATA_DIR: dataDir,
			AUTH_JWT_SECRET: JWT_SECRET,
			SECRETS_KEY,
			PUBLIC_BASE_URL: "https://webhooks.example.test",
			TRANSPORTER: TEST_NATS_URL,
			NAMESPACE: namespace,
			SMTP_URL: smtp.url,
			MAIL_FROM: "Satellite Tasking <no-reply@example.test>",
			WEBHOOK_ALLOW_NETS: "127.0.0.0/8",
			WEBHOOK_CA_FILE: receiver.writeCaFile(),
			DATABASE_URL: database === "postgres" ? TEST_DATABASE_URL : "",
			DATABASE_SCHEMA: database === "postgres" ? schema : "",
			REPL: "",
			LOG_LEVEL: "info",
		};
		server = spawn(process.execPath, ["dist/server.js"], { cwd: layout.dir, env: { ...process.env, ...env } });
		server.stdout!.on("data", chunk => (output += chunk));
		server.stderr!.on("data", chunk => (output += chunk));
		exited = new Promise(resolve => server.on("close", code => resolve(code)));
		await waitUntil(
			async () => {
				// A death by signal (an abort) leaves exitCode null and sets signalCode.
				if (server.exitCode !== null || server.signalCode !== null) {
					throw new Error(`the server exited (${server.exitCode ?? server.signalCode}):\n${output}`);
				}
				return fetch(`${opsUrl}/health`).then(response => response.status, () => 0);
			},
			status => status === 200,
			"the compiled server to be healthy",
			90_000,
		).catch(err => {
			// What the server logged says why it never came up.
			throw new Error(`${(err as Error).message}\nthe server's output:\n${output.slice(-8_000)}`);
		});
		producer = new ServiceBroker({
			namespace,
			nodeID: `${namespace}-producer`,
			transporter: TEST_NATS_URL,
			logger: false,
			middlewares: [ChannelsMiddleware({ adapter: { type: "NATS", options: { nats: { url: TEST_NATS_URL } } } } as never) as unknown as Middleware],
		});
		await producer.start();
	});

	afterAll(async () => {
		await producer?.stop();
		if (server && server.exitCode === null) server.kill("SIGKILL");
		await receiver?.close();
		await smtp?.close();
		await dropIntakeStreams(TEST_NATS_URL, namespace);
		if (database === "postgres") {
			await dropTestSchema(schema);
		}
		layout?.remove();
		fs.rmSync(dataDir, { recursive: true, force: true });
	});

	it("has nothing but compiled JavaScript to run: no TypeScript source in its directory", () => {
		const sources: string[] = [];
		const visit = (dir: string) => {
			for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
				if (entry.isDirectory()) visit(path.join(dir, entry.name));
				else if (/\.tsx?$/.test(entry.name)) sources.push(entry.name);
			}
		};
		visit(layout.dir);
		expect(sources).toEqual([]);
		expect(fs.existsSync(path.join(layout.dir, "dist", "lib", "sender-thread.js"))).toBe(true);
	});

	it("passes the image's check of the native SQLite addon, run as the Dockerfile writes it", () => {
		const check = fs
			.readFileSync(path.join(__dirname, "..", "Dockerfile"), "utf8")
			.split("\n")
			.find(line => line.startsWith("RUN node -e") && line.includes("sqliteAddonProblem"));
		expect(check).toBeDefined();
		// This Node first on PATH: under the smoke suite, Node 24 and the addon built for it.
		const env = { ...process.env, PATH: `${path.dirname(process.execPath)}${path.delimiter}${process.env.PATH}` };
		const result = spawnSync("sh", ["-c", check!.slice("RUN ".length)], { cwd: layout.dir, env, encoding: "utf8" });
		expect({ status: result.status, stderr: result.stderr }).toEqual({ status: 0, stderr: "" });
	});

	it("serves the web app from web/dist", async () => {
		const page = await fetch(`${baseUrl}/`, { headers: { accept: "text/html" } });
		expect(page.status).toBe(200);
		expect(await page.text()).toMatch(/<!doctype html>/i);
	});

	it("delivers an event from the channel as a signed delivery and an email", async () => {
		const user = `compiled-${crypto.randomBytes(3).toString("hex")}`;
		const email = `${user}@example.test`;
		const bearer = token(user, email);
		const settings = await api("PUT", "/user/settings", bearer, { notifications: [{ category: "tasking", settings: [{ topic: "tasking:order_status", email: true }] }] });
		expect(settings.status).toBe(200);
		const created = await api("POST", "/webhooks", bearer, { name: "Compiled", url: `${receiver.url}/compiled/${user}`, events: ["tasking:order_status"] });
		expect(created.status).toBe(201);

		// The token names no customer: the user is their own customer, which is not their id.
		const event = { event_id: crypto.randomUUID(), user_id: user, customer_id: implicitCustomerId(user), order_id: `order-${user}`, status: "fulfilled" };
		await (producer as unknown as { sendToChannel(name: string, payload: unknown): Promise<void> }).sendToChannel(TASKING_ORDER_STATUS_EVENT, event);

		const [delivery] = await waitUntil(
			() => receiver.requests.filter(request => request.path === `/compiled/${user}`),
			requests => requests.length > 0,
			"the delivery",
		);
		const verified = verifyWebhook(delivery.body, delivery.headers, created.body.secret, { validate: true, types: ["tasking:order_status"] });
		expect(verified.data).toMatchObject({ order_id: event.order_id, status: "fulfilled", user_id: user });

		const [mail] = await smtp.waitForMessages(1, message => message.envelope.to.includes(email), 60_000);
		expect(mail.parsed.text).toContain(event.order_id);
	});

	it("stops on SIGTERM, draining, with exit code 0", async () => {
		server.kill("SIGTERM");
		expect(await exited).toBe(0);
		expect(output).toMatch(/SIGTERM received: stopping/);
		expect(output).not.toMatch(/\bERROR\b|Cannot find module|ERR_UNKNOWN_FILE_EXTENSION/);
	});
});
