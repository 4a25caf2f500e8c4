// `npm run listen`: a local HTTPS receiver for development. It keeps a development CA and a
// localhost certificate under DATA_DIR/listen, listens on https://localhost:<port>, registers (or
// resumes) its own webhook through the API as a local user, verifies every delivery with the
// SDK's verifyWebhook and prints it. It then asks the service for a test delivery: when the
// service cannot reach it (loopback is blocked and the CA unknown unless configured), it prints
// the one line to restart the service with.
//
//   npm run listen [-- --port 4443] [--api http://localhost:3000/id/v3] [--sub alice --email alice@example.com --customer acme]
//
// Until the service allows loopback, registering is refused: it prints the line and tries again
// every 2 s, so restarting the service with that line is the only step.
//
// Ctrl-C pauses its webhook, so that nothing piles up for a receiver that is not running; the
// next start resumes it with a fresh secret.
import https from "node:https";
import path from "node:path";
import { parseArgs } from "node:util";
import type { IncomingMessage, ServerResponse } from "node:http";
import { SatelliteWebhooksClient, ServiceUnavailableError, ValidationError, verifyWebhook, type Webhook } from "@satellite-webhooks/sdk";
import { ConfigError, loadConfig, type AppConfig } from "../lib/config";
import { mintToken } from "../lib/auth";
import { ensureDevelopmentCertificates, type DevelopmentCertificates } from "../lib/dev-certificates";

const ORDER_TOPIC = "tasking:order_status";
// The loopback ranges the service must be allowed to reach https://localhost:<port> (it resolves
// to both on most machines, and a delivery is blocked if any address is).
const LOOPBACK_NETS = "127.0.0.1/32,::1/128";
const API_WAIT_MESSAGE_EVERY_MS = 10_000;
const RECHECK_EVERY_MS = 2000;

interface Options {
	port: number;
	api: string;
	sub: string;
	email: string;
	customer?: string;
}

function readOptions(config: AppConfig): Options {
	const { values } = parseArgs({
		options: {
			port: { type: "string", default: "4443" },
			api: { type: "string" },
			sub: { type: "string", default: "alice" },
			email: { type: "string", default: "alice@example.com" },
			customer: { type: "string" },
		},
	});
	const port = Number(values.port);
	if (!Number.isInteger(port) || port < 1 || port > 65535) {
		process.stderr.write(`--port: ${values.port} is not a port (1-65535)\n`);
		process.exit(64);
	}
	return { port, api: values.api ?? `http://localhost:${config.PORT}/id/v3`, sub: values.sub, email: values.email, customer: values.customer };
}

/** A path as the user would type it from here: relative inside the working folder. */
function shownPath(file: string): string {
	const relative = path.relative(process.cwd(), path.resolve(file));
	return relative.startsWith("..") || path.isAbsolute(relative) ? path.resolve(file) : relative;
}

function readRawBody(request: IncomingMessage): Promise<Buffer> {
	return new Promise((resolve, reject) => {
		const chunks: Buffer[] = [];
		request.on("data", (chunk: Buffer) => chunks.push(chunk));
		request.on("end", () => resolve(Buffer.concat(chunks)));
		request.on("error", reject);
	});
}

function typeOf(raw: Buffer): string {
	try {
		const parsed = JSON.parse(raw.toString("utf8")) as { type?: unknown };
		return typeof parsed.type === "string" ? parsed.type : "(no type)";
	} catch {
		return "(not JSON)";
	}
}

/** One delivery, as printed: a heading line, then its data. */
function describeDelivery(request: IncomingMessage, raw: Buffer, secrets: string[]): { verified: boolean; text: string } {
	const at = new Date().toISOString();
	const id = String(request.headers["webhook-id"] ?? "(no webhook-id)");
	if (secrets.length === 0) {
		return { verified: false, text: `${at}  NOT VERIFIED (no secret yet: the webhook is not registered)  ${typeOf(raw)}  ${id}\n${raw.toString("utf8")}\n` };
	}
	try {
		const event = verifyWebhook(raw, request.headers, secrets);
		return { verified: true, text: `${at}  verified  ${event.type}  ${id}\n${JSON.stringify(event.data, null, 2)}\n` };
	} catch (err) {
		return { verified: false, text: `${at}  NOT VERIFIED (${(err as Error).message})  ${typeOf(raw)}  ${id}\n${raw.toString("utf8")}\n` };
	}
}

async function listenOnLoopback(certificates: DevelopmentCertificates, port: number, secrets: () => string[]): Promise<https.Server[]> {
	const handle = async (request: IncomingMessage, response: ServerResponse) => {
		const raw = await readRawBody(request);
		const { verified, text } = describeDelivery(request, raw, secrets());
		process.stdout.write(text);
		// A refused signature answers 400, as a real receiver would, so the delivery log shows it.
		response.writeHead(verified ? 200 : 400, { "content-type": "text/plain" }).end(verified ? "ok" : "signature not verified");
	};
	const servers: https.Server[] = [];
	// localhost resolves to both loopback addresses, and the service may pick either.
	for (const host of ["127.0.0.1", "::1"]) {
		const server = https.createServer({ key: certificates.key, cert: certificates.cert }, (request, response) => {
			handle(request, response).catch(err => response.writeHead(500).end(String(err)));
		});
		try {
			await new Promise<void>((resolve, reject) => {
				server.once("error", reject);
				server.listen(port, host, () => resolve());
			});
			servers.push(server);
		} catch (err) {
			const code = (err as NodeJS.ErrnoException).code;
			// A machine without IPv6 loopback still serves on 127.0.0.1.
			if (host === "::1" && (code === "EADDRNOTAVAIL" || code === "EAFNOSUPPORT")) continue;
			await Promise.all(servers.map(open => new Promise(resolve => open.close(resolve))));
			if (code === "EADDRINUSE") throw new ConfigError(`--port: port ${port} on ${host} is already in use; choose another with --port`);
			throw err;
		}
	}
	return servers;
}

/** Fetch's failure (nothing listens) or a 503 (a service still starting): worth waiting out. */
function notReadyYet(err: unknown): boolean {
	return err instanceof TypeError || err instanceof ServiceUnavailableError;
}

/** Runs `call` once the API can answer it, saying now and then what it waits for. */
async function whenReady<T>(call: () => Promise<T>, api: string): Promise<T> {
	let lastMessageAt = Date.now() - API_WAIT_MESSAGE_EVERY_MS;
	for (;;) {
		try {
			return await call();
		} catch (err) {
			if (!notReadyYet(err)) throw err;
			if (Date.now() - lastMessageAt >= API_WAIT_MESSAGE_EVERY_MS) {
				process.stdout.write(`Waiting for the service's API at ${api} (start it with npm start) …\n`);
				lastMessageAt = Date.now();
			}
			await new Promise(resolve => setTimeout(resolve, 1000));
		}
	}
}

async function findWebhook(client: SatelliteWebhooksClient, name: string): Promise<Webhook | undefined> {
	for await (const webhook of client.webhooks.list({ perPage: 100 })) if (webhook.name === name) return webhook;
	return undefined;
}

/** Creates this receiver's webhook, or resumes the one an earlier run made with a new secret. */
async function registerWebhook(client: SatelliteWebhooksClient, url: string): Promise<{ id: string; secret: string; created: boolean }> {
	const name = `npm run listen (${new URL(url).host})`;
	const existing = await findWebhook(client, name);
	if (!existing) {
		const created = await client.webhooks.create({ name, url, events: [ORDER_TOPIC] });
		return { id: created.id, secret: created.secret, created: true };
	}
	// Its secret was shown once, to an earlier run: take a new one.
	const rotated = await client.webhooks.rotate(existing.id);
	if (!existing.active) await client.webhooks.update(existing.id, { active: true });
	return { id: rotated.id, secret: rotated.secret, created: false };
}

/** The one line that lets a service started with `npm start` reach this receiver. */
function environmentLine(caFile: string): string {
	return `WEBHOOK_ALLOW_NETS=${LOOPBACK_NETS} WEBHOOK_CA_FILE=${caFile} npm start`;
}

function printRestartAdvice(reason: string, caFile: string): void {
	process.stdout.write(
		[
			`The service cannot deliver to this receiver yet (${reason}).`,
			"By default it delivers to public addresses only, trusting only the public CAs. Restart it with this line:",
			"",
			environmentLine(caFile),
			"",
			"",
		].join("\n"),
	);
}

function refusesLoopback(err: unknown): boolean {
	return err instanceof ValidationError && err.errors.some(problem => /loopback/.test(problem.message));
}

/** Registers once the service accepts a localhost URL, which takes a restart with the line printed. */
async function registerWhenAllowed(client: SatelliteWebhooksClient, url: string, api: string, caFile: string): Promise<{ id: string; secret: string; created: boolean }> {
	let advised = false;
	for (;;) {
		try {
			return await whenReady(() => registerWebhook(client, url), api);
		} catch (err) {
			if (!refusesLoopback(err)) throw err;
			if (!advised) printRestartAdvice("it refuses localhost webhook URLs: WEBHOOK_ALLOW_NETS has no loopback range", caFile);
			advised = true;
			await new Promise(resolve => setTimeout(resolve, RECHECK_EVERY_MS));
		}
	}
}

async function main(): Promise<void> {
	const { config } = loadConfig(process.env);
	const options = readOptions(config);
	if (config.AUTH_JWKS_URL) throw new ConfigError("Invalid configuration: AUTH_JWKS_URL: npm run listen signs in with a token made from AUTH_JWT_SECRET, which a JWKS-only service does not accept");
	const certificates = ensureDevelopmentCertificates(path.join(config.DATA_DIR, "listen"));
	const caFile = shownPath(certificates.caFile);
	process.stdout.write(`${certificates.created ? "Made" : "Using"} the local development CA ${caFile} and its certificate for localhost\n`);

	let secrets: string[] = [];
	const servers = await listenOnLoopback(certificates, options.port, () => secrets);
	const url = `https://localhost:${options.port}/`;
	process.stdout.write(`Listening on ${url}\n`);

	const token = () => mintToken(config, { sub: options.sub, email: options.email, customer: options.customer, expiresIn: "1h" });
	const client = new SatelliteWebhooksClient({ baseUrl: options.api, token });
	const webhook = await registerWhenAllowed(client, url, options.api, caFile);
	secrets = [webhook.secret];
	process.stdout.write(`${webhook.created ? "Created" : "Resumed"} webhook ${webhook.id} for ${ORDER_TOPIC} as ${options.sub}, with a new secret (${webhook.secret.slice(0, 10)}…)\n`);
	// So that an order event for this user also ends in an email (DATA_DIR/mail in the embedded mode).
	await whenReady(() => client.user.setEmail(ORDER_TOPIC, true), options.api);
	process.stdout.write(`Email for ${ORDER_TOPIC} is on for ${options.sub} <${options.email}>\n`);

	let stopping = false;
	const stop = async () => {
		if (stopping) return;
		stopping = true;
		try {
			await client.webhooks.update(webhook.id, { active: false });
			process.stdout.write(`Paused webhook ${webhook.id}; the next npm run listen resumes it\n`);
		} catch (err) {
			process.stderr.write(`Could not pause webhook ${webhook.id}: ${(err as Error).message}\n`);
		}
		for (const server of servers) {
			server.close();
			server.closeAllConnections();
		}
		process.exit(0);
	};
	process.on("SIGINT", stop);
	process.on("SIGTERM", stop);

	const test = await whenReady(() => client.webhooks.test(webhook.id), options.api);
	if (!test.success) printRestartAdvice(`its test delivery failed: ${test.title ?? "failed"}: ${test.detail}`, caFile);
	else process.stdout.write("The service reaches this receiver.\n");
	process.stdout.write("Waiting for deliveries (Ctrl-C stops) …\n");
}

main().catch(err => {
	process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
	process.exit(err instanceof ConfigError ? 78 : 1);
});
