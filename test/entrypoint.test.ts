// The server process as a supervisor sees it: it runs whole or stops with a reason. A busy port
// stops it naming the variable; SIGTERM, sent to the image's command the way `docker stop` sends
// it, drains and exits 0 with one clean stop; a NATS connection that is closed for good makes
// /health answer 503 and the process exit non-zero.
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { freePort } from "./helpers/net";
import { ensureBuilt } from "./helpers/compiled-build";
import { startNatsServer, type NatsServer } from "./helpers/nats-server";
import { natsEnabled, TEST_DATABASE_URL, TEST_NATS_URL } from "./helpers/services";
import { dropIntakeStreams } from "../lib/intake-channel";

const ROOT = path.resolve(__dirname, "..");
const KEY = Buffer.alloc(32, 7).toString("base64");
const JWT_SECRET = "e".repeat(40);
const sleep = (ms: number) => new Promise(resolve => setTimeout(resolve, ms));

interface Running {
	child: ChildProcess;
	output: () => string;
	exited: Promise<number | null>;
}

/** Unset what a developer's shell might carry, so that only the test's variables decide. */
const CLEAN_ENV = { DATABASE_URL: "", TRANSPORTER: "", SMTP_URL: "", AUTH_JWT_SECRET: "", SECRETS_KEY: "", AUTH_JWKS_URL: "", NODE_ENV: "", REPL: "" };

function run(command: string[], env: Record<string, string>, options: { ownProcessGroup?: boolean } = {}): Running {
	const child = spawn(command[0], command.slice(1), { cwd: ROOT, detached: options.ownProcessGroup, env: { ...process.env, ...CLEAN_ENV, LOG_LEVEL: "info", ...env } });
	let output = "";
	child.stdout!.on("data", chunk => (output += chunk));
	child.stderr!.on("data", chunk => (output += chunk));
	// "close": the process has exited and everything it (or a child holding its pipes) printed is in.
	const exited = new Promise<number | null>(resolve => child.on("close", code => resolve(code)));
	return { child, output: () => output, exited };
}

async function exitWithin(running: Running, ms: number): Promise<number | null> {
	const timeout = sleep(ms).then(() => "timeout" as const);
	const result = await Promise.race([running.exited, timeout]);
	if (result === "timeout") {
		running.child.kill("SIGKILL");
		throw new Error(`the process did not exit within ${ms} ms; output:\n${running.output()}`);
	}
	return result;
}

async function health(opsPort: number): Promise<{ status: number; body: any } | undefined> {
	try {
		const response = await fetch(`http://127.0.0.1:${opsPort}/health`, { signal: AbortSignal.timeout(3_000) });
		return { status: response.status, body: await response.json() };
	} catch {
		return undefined;
	}
}

async function waitForHealth(running: Running, opsPort: number, status: number, ms = 40_000): Promise<any> {
	const deadline = Date.now() + ms;
	for (;;) {
		const answer = await health(opsPort);
		if (answer?.status === status) return answer.body;
		if (running.child.exitCode !== null || Date.now() > deadline) {
			throw new Error(`/health never answered ${status} (last: ${JSON.stringify(answer)}); output:\n${running.output()}`);
		}
		await sleep(200);
	}
}

function holdPort(): Promise<net.Server> {
	return new Promise((resolve, reject) => {
		const server = net.createServer();
		server.once("error", reject);
		server.listen(0, "127.0.0.1", () => resolve(server));
	});
}

const portOf = (server: net.Server) => (server.address() as net.AddressInfo).port;

/** A run of `count` loopback ports that were all free a moment ago. */
async function consecutiveFreePorts(count: number): Promise<number> {
	const bindable = (port: number) =>
		new Promise<boolean>(resolve => {
			const server = net.createServer();
			server.once("error", () => resolve(false));
			server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)));
		});
	for (let tries = 0; tries < 50; tries++) {
		const base = 20_000 + Math.floor(Math.random() * 30_000);
		const free = await Promise.all(Array.from({ length: count }, (_, i) => bindable(base + i)));
		if (free.every(Boolean)) return base;
	}
	throw new Error(`found no ${count} consecutive free ports`);
}

async function waitFor(condition: () => boolean, running: Running, ms = 60_000): Promise<void> {
	const deadline = Date.now() + ms;
	while (!condition()) {
		if (Date.now() > deadline) throw new Error(`timed out; output:\n${running.output()}`);
		await sleep(200);
	}
}


// Each test starts real processes (several, for the cluster recipe): slow on a loaded machine.
jest.setTimeout(120_000);

describe("the server process", () => {
	const dirs: string[] = [];
	const dataDir = () => {
		const dir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-entry-"));
		dirs.push(dir);
		return dir;
	};
	afterAll(() => dirs.forEach(dir => fs.rmSync(dir, { recursive: true, force: true })));

	it.each([["PORT"], ["OPS_PORT"]])("stops at once, exit 78, naming %s when that port is busy", async variable => {
		const busy = await holdPort();
		try {
			const other = variable === "PORT" ? "OPS_PORT" : "PORT";
			const running = run(["node", "--import", "tsx", "server.ts"], { DATA_DIR: dataDir(), HOST: "127.0.0.1", [variable]: String(portOf(busy)), [other]: String(await freePort()) });
			expect(await exitWithin(running, 40_000)).toBe(78);
			expect(running.output()).toContain(`Invalid configuration: ${variable}: port ${portOf(busy)} is already in use by another process`);
			// It never claimed to be up, and printed no stack trace.
			expect(running.output()).not.toMatch(/started successfully|\n\s+at /);
		} finally {
			busy.close();
		}
	});

	it("runs the image's command directly, so SIGTERM as `docker stop` sends it drains the broker and exits 0", async () => {
		// The command runs the compiled server (dist/), as the image does.
		ensureBuilt();
		const dockerfile = fs.readFileSync(path.join(ROOT, "Dockerfile"), "utf8");
		const cmd = JSON.parse(/^CMD (\[.*\])\s*$/m.exec(dockerfile)![1]) as string[];
		expect(cmd[0]).toBe("node");
		const opsPort = await freePort();
		const running = run(cmd, {
			NODE_ENV: "production",
			DATA_DIR: dataDir(),
			HOST: "127.0.0.1",
			PORT: "0",
			OPS_PORT: String(opsPort),
			AUTH_JWT_SECRET: JWT_SECRET,
			SECRETS_KEY: KEY,
			PUBLIC_BASE_URL: "https://webhooks.example.test",
		});
		await waitForHealth(running, opsPort, 200);
		// docker stop signals PID 1, which is this process itself: nothing stands in between.
		running.child.kill("SIGTERM");
		expect(await exitWithin(running, 30_000)).toBe(0);
		const output = running.output();
		expect(output.match(/SIGTERM received: stopping/g)).toHaveLength(1);
		expect(output.match(/ServiceBroker is stopped/g)).toHaveLength(1);
		expect(output).not.toMatch(/ERROR|Unable to stop/);
	});

	const describeCluster = natsEnabled() && process.env.TEST_POSTGRES === "yes" ? describe : describe.skip;
	describeCluster("npm run cluster (the README's recipe for a cluster without Docker)", () => {
		it("starts a gateway, two dispatchers and a notifier as processes of their own, and Ctrl-C stops them all", async () => {
			const opsBase = await consecutiveFreePorts(4);
			const namespace = `recipe-${process.pid}`;
			const running = run(["npm", "run", "cluster"], {
				TRANSPORTER: TEST_NATS_URL,
				DATABASE_URL: TEST_DATABASE_URL,
				DATABASE_SCHEMA: `recipe_${process.pid}`,
				NAMESPACE: namespace,
				DATA_DIR: dataDir(),
				HOST: "127.0.0.1",
				PORT: String(await freePort()),
				OPS_PORT: String(opsBase),
			}, { ownProcessGroup: true });
			try {
				const expected: Array<[string, string[]]> = [
					["gateway", ["api", "topics", "webhooks", "users"]],
					["dispatcher-1", ["dispatcher"]],
					["dispatcher-2", ["dispatcher"]],
					["notifier", ["notifier"]],
				];
				for (const [i, [role, services]] of expected.entries()) {
					const report = await waitForHealth(running, opsBase + i, 200, 90_000);
					expect(report).toMatchObject({ node: `${namespace}-${role}`, services, checks: { transporter: { ok: true }, intake: { ok: true }, database: { ok: true } } });
				}
				await waitFor(() => running.output().includes("[cluster] all roles are up"), running);
				// Ctrl-C in a terminal: SIGINT to the whole foreground process group.
				process.kill(-running.child.pid!, "SIGINT");
				await exitWithin(running, 40_000);
				// Every role drained and stopped: no ops port answers any more.
				for (let i = 0; i < 4; i++) expect(await health(opsBase + i)).toBeUndefined();
				expect(running.output().match(/ServiceBroker is stopped/g)).toHaveLength(4);
			} finally {
				if (running.child.exitCode === null) process.kill(-running.child.pid!, "SIGKILL");
				// The shared JetStream server keeps streams: remove this test's.
				await dropIntakeStreams(TEST_NATS_URL, namespace);
			}
		}, 240_000);
	});

	const describeWithNats = natsEnabled() ? describe : describe.skip;
	describeWithNats("with a NATS server of its own", () => {
		let nats: NatsServer | undefined;
		afterEach(async () => {
			await nats?.close();
			nats = undefined;
		});

		it("stops within its bound on SIGTERM while NATS is down, instead of hanging until SIGKILL", async () => {
			nats = await startNatsServer();
			const opsPort = await freePort();
			const running = run(["node", "--import", "tsx", "server.ts"], {
				SERVICES: "topics,dispatcher,notifier",
				TRANSPORTER: nats.url,
				NAMESPACE: `entry-down-${process.pid}`,
				DATA_DIR: dataDir(),
				HOST: "127.0.0.1",
				OPS_PORT: String(opsPort),
			});
			try {
				await waitForHealth(running, opsPort, 200);
				await nats.stop();
				// The node sees NATS gone (it keeps trying to reconnect meanwhile).
				await waitForHealth(running, opsPort, 503, 20_000);
				const asked = Date.now();
				running.child.kill("SIGTERM");
				const code = await exitWithin(running, 40_000);
				console.log(`SIGTERM with NATS down: exit ${code} after ${Date.now() - asked} ms`);
				expect(code).toBe(0);
				expect(running.output()).toMatch(/ServiceBroker is stopped/);
			} finally {
				if (running.child.exitCode === null) running.child.kill("SIGKILL");
			}
		});

		it("answers 503 and exits non-zero once NATS closes the connection for good (credentials no longer accepted)", async () => {
			nats = await startNatsServer();
			const opsPort = await freePort();
			const running = run(["node", "--import", "tsx", "server.ts"], {
				SERVICES: "topics",
				TRANSPORTER: nats.url,
				NAMESPACE: `entry-${process.pid}`,
				DATA_DIR: dataDir(),
				HOST: "127.0.0.1",
				OPS_PORT: String(opsPort),
			});
			try {
				const up = await waitForHealth(running, opsPort, 200);
				expect(up.checks).toMatchObject({ transporter: { ok: true }, intake: { ok: true } });
				// The server comes back demanding credentials this node does not have: its clients
				// are refused and give up, which no reconnect loop can mend.
				await nats.stop("SIGTERM");
				await nats.start(["--user", "someone", "--pass", "else"]);
				const down = await waitForHealth(running, opsPort, 503, 30_000).catch(() => undefined);
				const code = await exitWithin(running, 60_000);
				expect(code).not.toBe(0);
				expect(code).not.toBeNull();
				expect(running.output()).toMatch(/NATS connection of the (transporter|intake channel) is closed for good/);
				if (down) expect(down.status).toBe("unavailable");
			} finally {
				if (running.child.exitCode === null) running.child.kill("SIGKILL");
			}
		});
	});
});
