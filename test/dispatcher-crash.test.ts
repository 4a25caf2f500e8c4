// A dispatcher process killed with SIGKILL in the middle of a run loses no delivery: after a
// restart its expired leases are claimed again and every delivery reaches the receiver at least
// once. Duplicates can only come from deliveries the dead process held a lease on (an attempt in
// flight, or made but not yet recorded), so there are at most as many as such leases.
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import knex, { type Knex } from "knex";
import { testDatabases, TEST_DATABASE_URL } from "./helpers/services";
import { startHttpsReceiver, verifyDelivery, type HttpsReceiver } from "./helpers/https-receiver";
import { waitUntil } from "./helpers/delivery-stack";

const EVENTS = 600;
const CONCURRENCY = 16;
const CHILD = path.join(__dirname, "helpers", "dispatcher-child.ts");

interface Child {
	process: ChildProcessWithoutNullStreams;
	messages: Array<Record<string, any>>;
	exited: Promise<number | null>;
}

function startChild(env: Record<string, string>): Child {
	// Node itself with the tsx loader: a wrapper process would stand between our signals and the app.
	const child = spawn(process.execPath, ["--import", "tsx", CHILD], { env: { ...process.env, ...env }, stdio: "pipe" });
	const messages: Array<Record<string, any>> = [];
	readline.createInterface({ input: child.stdout }).on("line", line => {
		try {
			messages.push(JSON.parse(line));
		} catch {
			// not one of our reports
		}
	});
	let stderr = "";
	child.stderr.on("data", chunk => (stderr += chunk));
	const exited = new Promise<number | null>(resolve => child.on("exit", code => {
		if (code && code !== 0) console.error(`dispatcher child exited with ${code}: ${stderr}`);
		resolve(code);
	}));
	return { process: child, messages, exited };
}

describe.each(testDatabases())("dispatcher crash on %s", database => {
	let receiver: HttpsReceiver;
	let dataDir: string;
	let schema: string | undefined;
	let db: Knex;
	const children: Child[] = [];

	beforeAll(async () => {
		receiver = await startHttpsReceiver({ respond: async () => ({ status: 200, delayMs: 40 }) });
		dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-crash-"));
		schema = database === "postgres" ? `t_${crypto.randomBytes(6).toString("hex")}` : undefined;
	});
	afterAll(async () => {
		for (const child of children) if (child.process.exitCode === null && child.process.signalCode === null) child.process.kill("SIGKILL");
		await Promise.all(children.map(child => child.exited));
		if (schema && db) await db.raw(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
		await db?.destroy();
		await receiver?.close();
		fs.rmSync(dataDir, { recursive: true, force: true });
	});

	it("delivers every event at least once after a SIGKILL mid-run and a restart", async () => {
		const env: Record<string, string> = {
			NODE_ENV: "test",
			DATA_DIR: dataDir,
			SERVICES: "topics,webhooks,users,dispatcher",
			LOG_LEVEL: "error",
			WEBHOOK_ALLOW_NETS: "127.0.0.0/8",
			WEBHOOK_CA_FILE: receiver.writeCaFile(),
			DELIVERY_RETRY_SCHEDULE: "1s,2s,3s,4s,5s",
			DELIVERY_POLL_INTERVAL: "100ms",
			DELIVERY_TIMEOUT: "2s",
			DELIVERY_LEASE: "6s",
			DELIVERY_CONCURRENCY: String(CONCURRENCY),
			DELIVERY_WEBHOOK_CONCURRENCY: String(CONCURRENCY),
			...(schema ? { DATABASE_URL: TEST_DATABASE_URL, DATABASE_SCHEMA: schema } : {}),
		};

		const first = startChild({ ...env, CHILD_WEBHOOK_URL: `${receiver.url}/crash`, CHILD_PUBLISH: String(EVENTS) });
		children.push(first);
		const webhookMessage = await waitUntil(() => first.messages.find(message => message.webhook), Boolean, "the child to create the webhook", 60_000);
		const secret: string = webhookMessage!.webhook.secret;
		await waitUntil(() => first.messages.some(message => message.published), Boolean, "the child to publish every event", 60_000);
		await waitUntil(() => receiver.requests.length, count => count >= EVENTS / 6, "some deliveries to arrive", 60_000);
		first.process.kill("SIGKILL");
		await first.exited;
		const receivedBeforeKill = receiver.requests.length;
		expect(receivedBeforeKill).toBeLessThan(EVENTS);

		db = schema
			? knex({ client: "pg", connection: TEST_DATABASE_URL, searchPath: [schema], pool: { min: 0, max: 2 } })
			: knex({ client: "better-sqlite3", connection: { filename: path.join(dataDir, "service.sqlite") }, useNullAsDefault: true });
		// Every acknowledged event was persisted with its delivery before the crash.
		expect(Number((await db("deliveries").count({ count: "*" }))[0].count)).toBe(EVENTS);
		const [{ count: leased }] = await db("deliveries").where({ status: "pending" }).whereNotNull("lease_id").count({ count: "*" });
		const leasedAtKill = Number(leased);

		const second = startChild(env);
		children.push(second);
		const distinctIds = () => new Set(receiver.requests.map(request => String(request.headers["webhook-id"]))).size;
		await waitUntil(distinctIds, count => count === EVENTS, "every delivery to reach the receiver", 120_000);
		const succeeded = () => db("deliveries").where({ status: "succeeded" }).count({ count: "*" });
		await waitUntil(succeeded, ([{ count }]) => Number(count) === EVENTS, "every delivery to be recorded as succeeded", 60_000);

		for (const request of receiver.requests) verifyDelivery(request, secret);
		const duplicates = receiver.requests.length - EVENTS;
		console.info(
			`[${database}] crash test: ${receivedBeforeKill} requests before SIGKILL, ${leasedAtKill} leases left by the dead process, ` +
				`${receiver.requests.length} requests in all for ${EVENTS} deliveries: ${duplicates} duplicate(s)`,
		);
		// Only deliveries the dead process held a lease on can be attempted twice.
		expect(duplicates).toBeLessThanOrEqual(leasedAtKill);
		expect(new Set(receiver.requests.map(request => request.headers["webhook-id"])).size).toBe(EVENTS);

		second.process.kill("SIGTERM");
		expect(await second.exited).toBe(0);
	});
});
