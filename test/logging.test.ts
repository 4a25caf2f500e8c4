// Logs and request ids: a real server process in production mode writes JSON lines; the id the
// gateway takes from a safe X-Request-Id (or makes up) is echoed in the response and appears on
// the log lines of every service the request reached; no secret or token reaches the log.
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { SignJWT } from "jose";
import { requestIdFrom } from "../lib/gateway-policy";
import type { Context } from "moleculer";
import { currentRequestId, logFormatter, redactSecrets, RequestScopeMiddleware } from "../lib/logging";
import { freePort } from "./helpers/net";
import { waitUntil } from "./helpers/delivery-stack";
import { serviceCommand } from "./helpers/service-build";

const ROOT = path.resolve(__dirname, "..");
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

describe("requestIdFrom", () => {
	it.each(["abc-123", "req_1.2-3", "x".repeat(64), "3bb2e72c-0c3e-4a55-9d5e-8a2f2d6b1f00"])("honours the safe id %j", id => {
		expect(requestIdFrom(id)).toBe(id);
	});
	it.each([
		["too long", "x".repeat(65)],
		["empty", ""],
		["with spaces", "a b"],
		["with a newline (log injection)", "ok\n{\"level\":\"fatal\"}"],
		["with quotes and angle brackets", '"><script>'],
		["non-ASCII", "idé"],
		["with other punctuation", "req:3@host"],
	])("replaces an id that is %s with a fresh UUID", (_label, id) => {
		expect(requestIdFrom(id)).toMatch(UUID);
	});
	it("makes one up when none is sent, and takes the first of repeated headers", () => {
		expect(requestIdFrom(undefined)).toMatch(UUID);
		expect(requestIdFrom(["first", "second"])).toBe("first");
	});
});

describe("log formatting", () => {
	const printArgs = (args: unknown[]) => args.map(arg => (typeof arg === "object" ? JSON.stringify(arg) : arg));
	it("writes readable lines outside production, with no request id outside a request", () => {
		const [line] = logFormatter(false)("info", ["Webhook", "created"], { nodeID: "node-1", mod: "webhooks" }, { printArgs });
		expect(line).toMatch(/^\[\d{4}-\d\d-\d\dT[\d:.]+Z\] INFO {2}node-1\/WEBHOOKS: Webhook created$/);
	});
	it("masks webhook secrets, bearer tokens and JWTs", () => {
		const jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl";
		const text = redactSecrets(`secret whsec_AAAABBBB+/== header Bearer ${jwt} bare ${jwt}`);
		expect(text).toBe("secret whsec_[redacted] header Bearer [redacted] bare [redacted token]");
	});
});

describe("the request scope around handlers", () => {
	type Handler = (ctx: Context) => unknown;
	const scoped = (handler: Handler) => (RequestScopeMiddleware as unknown as { localAction(next: Handler): Handler }).localAction(handler);
	const call = (handler: Handler, requestID: string) => handler({ requestID } as Context);

	it("keeps each handler's request id through its awaits while others start and end, and leaves no promise hooks on once all have ended", async () => {
		const seen: Array<[string, string | undefined]> = [];
		let releaseFirst!: () => void;
		const first = call(
			scoped(async () => {
				seen.push(["first", currentRequestId()]);
				await new Promise<void>(resolve => (releaseFirst = resolve));
				await new Promise(resolve => setImmediate(resolve));
				seen.push(["first, after the second ended", currentRequestId()]);
			}),
			"req-first",
		);
		await call(
			scoped(async () => {
				await null;
				seen.push(["second", currentRequestId()]);
			}),
			"req-second",
		);
		releaseFirst();
		await first;
		expect(seen).toEqual([
			["first", "req-first"],
			["second", "req-second"],
			["first, after the second ended", "req-first"],
		]);
		expect(currentRequestId()).toBeUndefined();
	});

	it("closes the scope of a handler that throws or rejects", async () => {
		expect(() =>
			call(
				scoped(() => {
					throw new Error("thrown");
				}),
				"req-throws",
			),
		).toThrow("thrown");
		await expect(call(scoped(async () => Promise.reject(new Error("rejected"))), "req-rejects")).rejects.toThrow("rejected");
		expect(call(scoped(() => currentRequestId()), "req-sync")).toBe("req-sync");
		expect(currentRequestId()).toBeUndefined();
	});

	// In a process of its own: Jest's own environment keeps promise hooks on. Node gives a
	// promise's continuation an async id of its own only while promise hooks are on; Node 24's
	// AsyncLocalStorage never turns them on.
	it("turns promise hooks on only while a handler holds a scope (Node 20)", () => {
		const probe = `
			const { executionAsyncId } = require("node:async_hooks");
			const { RequestScopeMiddleware } = require("./lib/logging");
			const hooksOn = async () => { await null; return executionAsyncId() !== 0; };
			(async () => {
				const before = await hooksOn();
				const during = await RequestScopeMiddleware.localAction(() => hooksOn())({ requestID: "req-probe" });
				process.stdout.write(JSON.stringify({ before, during, after: await hooksOn() }));
			})();`;
		const output = execFileSync(process.execPath, ["--import", "tsx", "-e", probe], { cwd: path.join(__dirname, ".."), encoding: "utf8" });
		const promiseHooksOnNode = Number(process.versions.node.split(".")[0]) < 24;
		expect(JSON.parse(output)).toEqual({ before: false, during: promiseHooksOnNode, after: false });
	});
});

describe("a production server's logs", () => {
	let server: ChildProcess;
	let dataDir: string;
	let apiPort: number;
	let stdout = "";
	let stderr = "";
	const jwtSecret = crypto.randomBytes(48).toString("base64");
	let token: string;

	const api = (method: string, urlPath: string, headers: Record<string, string> = {}, body?: unknown) =>
		fetch(`http://127.0.0.1:${apiPort}${urlPath}`, {
			method,
			headers: { authorization: `Bearer ${token}`, ...(body ? { "content-type": "application/json" } : {}), ...headers },
			body: body ? JSON.stringify(body) : undefined,
		});
	const lines = () => stdout.split("\n").filter(Boolean);

	beforeAll(async () => {
		dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-logs-"));
		apiPort = await freePort();
		const opsPort = await freePort();
		token = await new SignJWT({ email: "ops@example.com", customer_id: "acme" })
			.setProtectedHeader({ alg: "HS256" })
			.setSubject("ops-user")
			.setIssuedAt()
			.setExpirationTime("10m")
			.sign(new TextEncoder().encode(jwtSecret));
		const { command, args } = serviceCommand();
		server = spawn(command, args, {
			cwd: ROOT,
			env: {
				PATH: process.env.PATH,
				NODE_ENV: "production",
				LOG_LEVEL: "debug",
				HOST: "127.0.0.1",
				PORT: String(apiPort),
				OPS_PORT: String(opsPort),
				DATA_DIR: dataDir,
				SECRETS_KEY: crypto.randomBytes(32).toString("base64"),
				AUTH_JWT_SECRET: jwtSecret,
				PUBLIC_BASE_URL: "https://api.example.com",
				// Production sends email only where told to.
				SMTP_URL: "file:",
			},
		});
		server.stdout!.on("data", chunk => (stdout += chunk));
		server.stderr!.on("data", chunk => (stderr += chunk));
		await waitUntil(
			() => fetch(`http://127.0.0.1:${opsPort}/health`).then(response => response.status, () => 0),
			status => status === 200,
			"the server to be healthy",
		);
	});
	afterAll(async () => {
		if (server && server.exitCode === null) {
			const exited = new Promise(resolve => server.once("exit", resolve));
			server.kill("SIGTERM");
			await exited;
		}
		fs.rmSync(dataDir, { recursive: true, force: true });
	});

	it("echoes a safe X-Request-Id and carries it onto the log lines of every service the request reached", async () => {
		const response = await api("POST", "/id/v3/webhooks", { "x-request-id": "req-logs-1" }, { name: "Logged", url: "https://hooks.example.com/logged", events: ["tasking:order_status"] });
		expect(response.status).toBe(201);
		expect(response.headers.get("x-request-id")).toBe("req-logs-1");
		const created = (await response.json()) as { id: string; secret: string };
		const tagged = await waitUntil(
			() => lines().filter(line => line.includes('"requestId":"req-logs-1"')).map(line => JSON.parse(line)),
			found => found.some(entry => entry.mod === "webhooks"),
			"a webhooks log line with the request id",
		);
		// The gateway's own lines and the webhooks service's line share the id.
		expect(tagged.find(entry => entry.mod === "webhooks")).toMatchObject({ level: "info", msg: expect.stringContaining(`Webhook ${created.id} created`) });
		expect(tagged.some(entry => entry.mod === "api")).toBe(true);

		// Rotation answers a new secret: neither secret nor the token ever reaches the log.
		const rotated = (await (await api("POST", `/id/v3/webhooks/${created.id}/rotate`, { "x-request-id": "req-logs-2" })).json()) as { secret: string };
		await waitUntil(lines, current => current.some(line => line.includes('"requestId":"req-logs-2"') && line.includes("secret rotated")), "the rotation's log line");
		for (const secret of [created.secret, rotated.secret, created.secret.slice(6, 30), token]) {
			expect(stdout).not.toContain(secret);
			expect(stderr).not.toContain(secret);
		}
	});

	it("replaces an unsafe or missing X-Request-Id with a generated one, and echoes that", async () => {
		const unsafe = await api("GET", "/id/v3/webhooks", { "x-request-id": "x".repeat(200) });
		expect(unsafe.status).toBe(200);
		const generated = unsafe.headers.get("x-request-id")!;
		expect(generated).toMatch(UUID);
		await waitUntil(lines, current => current.some(line => line.includes(`"requestId":"${generated}"`)), "a log line with the generated id");
		expect(stdout).not.toContain("x".repeat(200));

		const none = await api("GET", "/id/v3/webhooks/events");
		expect(none.headers.get("x-request-id")).toMatch(UUID);
		expect(none.headers.get("x-request-id")).not.toBe(generated);
		// Even an answer that never reaches an action carries one.
		const unknownPath = await api("GET", "/nowhere", { "x-request-id": "req-404" });
		expect(unknownPath.status).toBe(404);
		expect(unknownPath.headers.get("x-request-id")).toBe("req-404");
	});

	it("writes every line to stdout as one JSON object with time, level and message", () => {
		expect(lines().length).toBeGreaterThan(5);
		for (const line of lines()) {
			const entry = JSON.parse(line);
			expect(entry).toMatchObject({ time: expect.stringMatching(/Z$/), level: expect.stringMatching(/^(trace|debug|info|warn|error|fatal)$/), msg: expect.any(String) });
		}
	});
});
