// The server process as a supervisor sees it: it runs whole or stops with a reason. Bad or missing
// variables stop it at once with exit 78 naming each of them, NATS or PostgreSQL that does not
// answer stops it after STARTUP_CONNECT_TIMEOUT with exit 69 naming the variable and the address,
// and once up it says where its endpoints are. A busy port stops it naming the variable; SIGTERM, sent to the image's command the way `docker stop` sends
// it, drains and exits 0 with one clean stop; a NATS connection that is closed for good makes
// /health answer 503 and the process exit non-zero.
import { setTimeout as sleep } from "node:timers/promises";
import { execFile, spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { freePort } from "./helpers/net";
import { ensureBuilt } from "./helpers/compiled-build";
import { serviceCommand } from "./helpers/service-build";
import { startNatsServer, type NatsServer } from "./helpers/nats-server";
import { makeNatsAccounts } from "./helpers/nats-accounts";
import { describeWhere, dropTestSchema, TEST_DATABASE_URL, TEST_NATS_URL } from "./helpers/services";
import { dropIntakeStreams } from "../lib/intake-jetstream";

const ROOT = path.resolve(__dirname, "..");
const KEY = Buffer.alloc(32, 7).toString("base64");
const JWT_SECRET = "e".repeat(40);

interface Running {
	child: ChildProcess;
	output: () => string;
	exited: Promise<number | null>;
}

/** Unset what a developer's shell might carry, so that only the test's variables decide. */
const CLEAN_ENV = { DATABASE_URL: "", TRANSPORTER: "", SMTP_URL: "", AUTH_JWT_SECRET: "", SECRETS_KEY: "", AUTH_JWKS_URL: "", NODE_ENV: "", REPL: "", PUBLIC_BASE_URL: "", SERVICES: "", STARTUP_CONNECT_TIMEOUT: "" };
/** The server as one node process (the run's transpiled copy); the image's command has a test of its own. */
const SERVER = serviceCommand();
const SERVER_COMMAND = [SERVER.command, ...SERVER.args];
/** A stack trace line, as Node prints them: "    at fn (file:line:col)". */
const STACK_LINE = /^\s+at /m;

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
		if (running.child.exitCode !== null || running.child.signalCode !== null || Date.now() > deadline) {
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
	// Below the kernel's ephemeral range, which outgoing connections and every listen on port 0
	// draw from: there, another test took one of the four while the recipe's later processes were
	// still starting (dispatcher-2 found its OPS_PORT in use 18 s after the check).
	const ephemeralLow = Number(fs.readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]) || 32_768;
	for (let tries = 0; tries < 50; tries++) {
		const base = 10_000 + Math.floor(Math.random() * (ephemeralLow - 10_000 - count));
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
			const running = run(SERVER_COMMAND, { DATA_DIR: dataDir(), HOST: "127.0.0.1", [variable]: String(portOf(busy)), [other]: String(await freePort()) });
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
		await ensureBuilt();
		const dockerfile = fs.readFileSync(path.join(ROOT, "Dockerfile"), "utf8");
		const cmd = JSON.parse(/^CMD (\[.*\])\s*$/m.exec(dockerfile)![1]) as string[];
		expect(cmd[0]).toBe("node");
		const opsPort = await freePort();
		const imageDataDir = dataDir();
		const running = run(cmd, {
			NODE_ENV: "production",
			DATA_DIR: imageDataDir,
			HOST: "127.0.0.1",
			PORT: "0",
			OPS_PORT: String(opsPort),
			AUTH_JWT_SECRET: JWT_SECRET,
			SECRETS_KEY: KEY,
			PUBLIC_BASE_URL: "https://webhooks.example.test",
			// Production sends email only where told: here, explicitly to files.
			SMTP_URL: "file:",
		});
		await waitForHealth(running, opsPort, 200);
		expect(running.output()).toContain(`Sending email through files in ${path.join(imageDataDir, "mail")}`);
		// docker stop signals PID 1, which is this process itself: nothing stands in between.
		running.child.kill("SIGTERM");
		expect(await exitWithin(running, 30_000)).toBe(0);
		const output = running.output();
		expect(output.match(/SIGTERM received: stopping/g)).toHaveLength(1);
		expect(output.match(/ServiceBroker is stopped/g)).toHaveLength(1);
		expect(output).not.toMatch(/ERROR|Unable to stop/);
	});

	describe("start-up that either works or stops, saying why", () => {
		const KEY_ENV = { SECRETS_KEY: KEY, AUTH_JWT_SECRET: JWT_SECRET };

		/** Runs the server to its exit; checks the code, that it never came up, and that no stack trace was printed. */
		async function stopsWith(code: number, env: Record<string, string>): Promise<string> {
			const running = run(SERVER_COMMAND, { DATA_DIR: dataDir(), HOST: "127.0.0.1", PORT: "0", OPS_PORT: "0", ...env });
			expect({ code: await exitWithin(running, 60_000), output: running.output() }).toEqual({ code, output: expect.any(String) });
			const output = running.output();
			expect(output).not.toMatch(STACK_LINE);
			expect(output).not.toMatch(/started successfully|Running /);
			return output;
		}

		it("lists every bad and every missing value in one start, and exits 78", async () => {
			const output = await stopsWith(78, { NODE_ENV: "production", PORT: "abc", DELIVERY_TIMEOUT: "soon" });
			expect(output).toMatch(/^ {2}PORT: "abc" is not a whole number from 0 to 65535 \(0 picks a free port\)$/m);
			expect(output).toMatch(/^ {2}DELIVERY_TIMEOUT: "soon" is not a duration/m);
			for (const missing of ["AUTH_JWT_SECRET", "SECRETS_KEY", "PUBLIC_BASE_URL", "SMTP_URL"]) expect(output).toMatch(new RegExp(`^ {2}${missing}: required with NODE_ENV=production`, "m"));
		});

		it.each([
			["PUBLIC_BASE_URL", { SMTP_URL: "file:" }, /^ {2}PUBLIC_BASE_URL: required with NODE_ENV=production when the notifier runs: the address the links in emails point to$/m],
			["SMTP_URL", { PUBLIC_BASE_URL: "https://webhooks.example.test" }, /^ {2}SMTP_URL: required with NODE_ENV=production when the notifier runs \(smtp:\/\/… or smtps:\/\/…\); file: writes emails as \.eml files under DATA_DIR\/mail instead$/m],
		])("refuses a production notifier without %s: exit 78, naming it", async (_variable, env, message) => {
			const output = await stopsWith(78, { NODE_ENV: "production", SERVICES: "notifier", ...KEY_ENV, ...env });
			expect(output).toMatch(message);
			expect(output.match(/^ {2}[A-Z_]+: /gm)).toHaveLength(1);
		});

		it("stops after STARTUP_CONNECT_TIMEOUT when NATS does not answer: exit 69, one line naming TRANSPORTER and the address", async () => {
			const port = await freePort();
			const output = await stopsWith(69, { TRANSPORTER: `nats://127.0.0.1:${port}`, SERVICES: "topics", STARTUP_CONNECT_TIMEOUT: "2s" });
			const lines = output.split("\n").filter(line => line.startsWith("Cannot start: "));
			expect(lines).toEqual([`Cannot start: TRANSPORTER: NATS at nats://127.0.0.1:${port} did not answer within 2s (CONNECTION_REFUSED); is it running at that address? STARTUP_CONNECT_TIMEOUT sets the wait`]);
			expect(output).toContain(`Waiting up to 2s for NATS at nats://127.0.0.1:${port} (TRANSPORTER): CONNECTION_REFUSED`);
		});

		it("stops after STARTUP_CONNECT_TIMEOUT when PostgreSQL does not answer: exit 69, one line naming DATABASE_URL and the address, password masked", async () => {
			const port = await freePort();
			const output = await stopsWith(69, { DATABASE_URL: `postgres://webhooks:hunter2-not-shown@127.0.0.1:${port}/webhooks`, STARTUP_CONNECT_TIMEOUT: "2s" });
			const lines = output.split("\n").filter(line => line.startsWith("Cannot start: "));
			expect(lines).toEqual([`Cannot start: DATABASE_URL: PostgreSQL at postgres://webhooks:***@127.0.0.1:${port}/webhooks did not answer within 2s (ECONNREFUSED); is it running at that address? STARTUP_CONNECT_TIMEOUT sets the wait`]);
			expect(output).not.toContain("hunter2");
		});

		it("says where to go once up, listening on loopback only in development", async () => {
			const dir = dataDir();
			const running = run(SERVER_COMMAND, { DATA_DIR: dir, HOST: "", PORT: "0", OPS_PORT: "0" });
			try {
				await waitFor(() => /^ {2}Token {4}.*\n/m.test(running.output()), running);
				const output = running.output();
				const address = (label: string) => new RegExp(`^ {2}${label} +(\\S+)$`, "m").exec(output)?.[1] ?? "";
				const summary = { webApp: address("Web app"), api: address("API"), openApi: address("OpenAPI"), health: address("Health"), metrics: address("Metrics") };
				expect(summary).toEqual({
					webApp: expect.stringMatching(/^http:\/\/localhost:\d+\/$/),
					api: expect.stringMatching(/^http:\/\/localhost:\d+\/id\/v3$/),
					openApi: expect.stringMatching(/^http:\/\/localhost:\d+\/openapi\.json$/),
					health: expect.stringMatching(/^http:\/\/localhost:\d+\/health$/),
					metrics: expect.stringMatching(/^http:\/\/localhost:\d+\/metrics$/),
				});
				expect(output).toContain(`Running api, topics, webhooks, users, dispatcher, notifier (SQLite in ${path.join(dir, "service.sqlite")}, email as .eml files in ${path.join(dir, "mail")})`);
				expect(output).toContain("Listening on this machine only (HOST=127.0.0.1)");
				// The token command, run as printed, gives a token the API accepts.
				const tokenCommand = /^ {2}Token {4}(.*)$/m.exec(output)![1];
				expect(tokenCommand).toBe(`DATA_DIR=${dir} npm run -s token -- --sub alice --email alice@example.com`);
				const token = await new Promise<string>((resolve, reject) =>
					execFile("sh", ["-c", tokenCommand], { cwd: ROOT, env: { ...process.env, ...CLEAN_ENV } }, (err, stdout) => (err ? reject(err) : resolve(stdout.trim()))),
				);
				const details = await fetch(`${summary.api}/user/details`, { headers: { authorization: `Bearer ${token}` } });
				expect({ status: details.status, user: ((await details.json()) as { user_id?: string }).user_id }).toEqual({ status: 200, user: "alice" });
				const page = await fetch(summary.webApp);
				expect({ status: page.status, type: page.headers.get("content-type") }).toEqual({ status: 200, type: expect.stringContaining("text/html") });
				const document = (await (await fetch(summary.openApi)).json()) as { openapi?: string };
				expect(document.openapi).toMatch(/^3\.1/);
				expect((await fetch(summary.health)).status).toBe(200);
				expect(await (await fetch(summary.metrics)).text()).toContain("# TYPE");
				// Nothing answers on the machine's other addresses.
				const apiPort = Number(new URL(summary.api).port);
				const elsewhere = Object.values(os.networkInterfaces())
					.flat()
					.find(entry => entry && entry.family === "IPv4" && !entry.internal);
				if (elsewhere) {
					await expect(fetch(`http://${elsewhere.address}:${apiPort}/`, { signal: AbortSignal.timeout(5_000) })).rejects.toThrow();
				} else {
					console.log("no non-loopback IPv4 address on this machine: loopback-only listening checked through the log line alone");
				}
				expect(output).toContain(`API Gateway listening on http://127.0.0.1:${apiPort}`);
			} finally {
				running.child.kill("SIGTERM");
				await exitWithin(running, 30_000);
			}
		});
	});

	const describeCluster = describeWhere({ nats: true, postgres: true });
	describeCluster("npm run cluster (the recipe of docs/cluster.md for a cluster without Docker)", () => {
		/** The recipe's one command line: the variables it sets, and the command. */
		function recipe(): { variables: string[]; command: string[] } {
			const doc = fs.readFileSync(path.join(ROOT, "docs", "cluster.md"), "utf8");
			const blocks = [...doc.matchAll(/```sh\n([\s\S]*?)```/g)].map(match => match[1].trim());
			expect(blocks).toHaveLength(1);
			const words = blocks[0].split(/\s+/);
			const variables = words.filter(word => /^[A-Z_]+=/.test(word)).map(word => word.split("=")[0]);
			return { variables, command: words.slice(variables.length) };
		}

		it("starts a gateway, two dispatchers and a notifier as processes of their own, and Ctrl-C stops them all", async () => {
			// The command docs/cluster.md shows, with its two variables pointed at this test's servers
			// (the others only keep this run apart from anything else on the machine).
			const { variables, command } = recipe();
			expect(variables).toEqual(["TRANSPORTER", "DATABASE_URL"]);
			expect(command).toEqual(["npm", "run", "cluster"]);
			const opsBase = await consecutiveFreePorts(4);
			const namespace = `recipe-${process.pid}`;
			const schema = `recipe_${process.pid}`;
			const running = run(command, {
				TRANSPORTER: TEST_NATS_URL,
				DATABASE_URL: TEST_DATABASE_URL,
				DATABASE_SCHEMA: schema,
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
				// The shared JetStream server keeps streams, and the shared PostgreSQL schemas: remove this test's.
				await dropIntakeStreams(TEST_NATS_URL, namespace);
				await dropTestSchema(schema);
			}
		}, 240_000);
	});

	const describeWithNats = describeWhere({ nats: true });
	describeWithNats("with a NATS server of its own", () => {
		let nats: NatsServer | undefined;
		afterEach(async () => {
			await nats?.close();
			nats = undefined;
		});

		/** The server as a node of this test's NATS server, with data and an ops port of its own. */
		async function startNode(services: string, namespace: string, env: Record<string, string> = {}): Promise<{ running: Running; opsPort: number }> {
			const opsPort = await freePort();
			const running = run(SERVER_COMMAND, {
				SERVICES: services,
				TRANSPORTER: nats!.url,
				NAMESPACE: `${namespace}-${process.pid}`,
				DATA_DIR: dataDir(),
				HOST: "127.0.0.1",
				OPS_PORT: String(opsPort),
				...env,
			});
			return { running, opsPort };
		}

		const PASSWORD = "p@ss:w/rd%";
		const TOKEN = "t0ken/with:odd@chars";
		/** How a server wants a node to log in: its arguments, the node's variables, and the secret never to print. */
		type Login = { serverArgs: string[]; env: (port: number) => Record<string, string>; secret: string };
		it.each<{ wants: string; login: () => Promise<Login> }>([
			{
				wants: "a user and password, given percent-encoded in TRANSPORTER's URL",
				login: async () => ({ serverArgs: ["--user", "webhooks", "--pass", PASSWORD], env: port => ({ TRANSPORTER: `nats://webhooks:${encodeURIComponent(PASSWORD)}@127.0.0.1:${port}` }), secret: PASSWORD }),
			},
			{
				wants: "a token, given as the URL's user name",
				login: async () => ({ serverArgs: ["--auth", TOKEN], env: port => ({ TRANSPORTER: `nats://${encodeURIComponent(TOKEN)}@127.0.0.1:${port}` }), secret: TOKEN }),
			},
			{
				wants: "a user's JWT (decentralized auth), given as NATS_CREDS_FILE",
				login: async () => {
					const accounts = await makeNatsAccounts(path.join(dataDir(), "nats-accounts"));
					const seed = /SU[A-Z2-7]{56}/.exec(fs.readFileSync(accounts.credsFile, "utf8"))![0];
					return { serverArgs: ["-c", accounts.serverConfigFile], env: () => ({ NATS_CREDS_FILE: accounts.credsFile }), secret: seed };
				},
			},
		])("joins a NATS server that wants $wants, and never prints it", async ({ login }) => {
			const { serverArgs, env, secret } = await login();
			nats = await startNatsServer();
			await nats.stop();
			await nats.start(serverArgs);
			// The start-up check, the transporter, the intake's provisioning and its channel adapter
			// each open a connection of their own: every one of them must log in.
			const { running, opsPort } = await startNode("topics", "entry-auth", env(nats.port));
			try {
				const up = await waitForHealth(running, opsPort, 200);
				expect(up.checks).toMatchObject({ transporter: { ok: true }, intake: { ok: true } });
				expect(running.output()).toContain("Durable intake ready");
				expect(running.output()).not.toMatch(/Authorization Violation/i);
				expect(running.output()).not.toContain(encodeURIComponent(secret));
				expect(running.output()).not.toContain(secret);
			} finally {
				running.child.kill("SIGTERM");
				await exitWithin(running, 30_000);
			}
		});

		it("stops at once, exit 78, when NATS refuses the user of NATS_CREDS_FILE", async () => {
			const accounts = await makeNatsAccounts(path.join(dataDir(), "nats-accounts"));
			nats = await startNatsServer();
			await nats.stop();
			await nats.start(["-c", accounts.serverConfigFile]);
			const { running } = await startNode("topics", "entry-stranger", { NATS_CREDS_FILE: accounts.strangerCredsFile });
			expect(await exitWithin(running, 30_000)).toBe(78);
			expect(running.output()).toMatch(/TRANSPORTER: NATS at nats:\/\/127\.0\.0\.1:\d+ refused this node's credentials \(AUTHORIZATION_VIOLATION\)/);
		});

		it("waits at start-up for a NATS server that comes up within STARTUP_CONNECT_TIMEOUT", async () => {
			nats = await startNatsServer();
			await nats.stop();
			const { running, opsPort } = await startNode("topics", "entry-late", { STARTUP_CONNECT_TIMEOUT: "90s" });
			try {
				await waitFor(() => running.output().includes(`Waiting up to 90s for NATS at ${nats!.url} (TRANSPORTER)`), running);
				await nats.start();
				const up = await waitForHealth(running, opsPort, 200, 60_000);
				expect(up.checks).toMatchObject({ transporter: { ok: true } });
				expect(running.output()).not.toContain("Cannot start");
			} finally {
				running.child.kill("SIGTERM");
				await exitWithin(running, 30_000);
			}
		});

		it("stops within its bound on SIGTERM while NATS is down, instead of hanging until SIGKILL", async () => {
			nats = await startNatsServer();
			const { running, opsPort } = await startNode("topics,dispatcher,notifier", "entry-down");
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

		it("answers 503 while NATS is away, and exits non-zero once NATS closes the connection for good (credentials no longer accepted)", async () => {
			nats = await startNatsServer();
			const { running, opsPort } = await startNode("topics", "entry");
			try {
				const up = await waitForHealth(running, opsPort, 200);
				expect(up.checks).toMatchObject({ transporter: { ok: true }, intake: { ok: true } });
				// The server comes back demanding credentials this node does not have: its clients
				// are refused and give up, which no reconnect loop can mend.
				await nats.stop("SIGTERM");
				// While the server is away the node says so, before the new one refuses it.
				const down = await waitForHealth(running, opsPort, 503, 20_000);
				expect(down).toMatchObject({ status: "unavailable", checks: { transporter: { ok: false } } });
				await nats.start(["--user", "someone", "--pass", "else"]);
				const code = await exitWithin(running, 60_000);
				expect(code).not.toBe(0);
				expect(code).not.toBeNull();
				expect(running.output()).toMatch(/NATS connection of the (transporter|intake channel) is closed for good/);
			} finally {
				if (running.child.exitCode === null) running.child.kill("SIGKILL");
			}
		});
	});
});
