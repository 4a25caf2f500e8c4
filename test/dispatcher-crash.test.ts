// A dispatcher process killed with SIGKILL in the middle of a run loses no delivery: after a
// restart its expired leases are claimed again and every delivery reaches the receiver at least
// once. Duplicates can only come from deliveries the dead process held a lease on (an attempt in
// flight, or made but not yet recorded), so there are at most as many as such leases.
//
// PostgreSQL itself crashing under a running dispatcher (an immediate shutdown: no checkpoint,
// crash recovery at the next start) loses no delivery either. Attempts go on while it is down;
// their results are written once it is back, or, past their lease, the deliveries are due again
// and sent a second time. So a repeat can only be a delivery first sent before it came back.
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import knex, { type Knex } from "knex";
import { describeWhere, testDatabases, TEST_DATABASE_URL } from "./helpers/services";
import { startHttpsReceiver, verifyDelivery, type HttpsReceiver } from "./helpers/https-receiver";
import { sleep, waitUntil } from "./helpers/delivery-stack";
import { postgresBinDir, startPostgresServer, type PostgresServer } from "./helpers/postgres-server";
import { serviceCommand } from "./helpers/service-build";

const EVENTS = 600;
/** A crash test's own bound: the sum of the bounded waits inside it (start-up, publishing, every delivery). */
const CRASH_TEST_BOUND_MS = 240_000;
const CONCURRENCY = 16;
const CHILD = "test/helpers/dispatcher-child.ts";

interface Child {
	process: ChildProcessWithoutNullStreams;
	messages: Array<Record<string, any>>;
	exited: Promise<number | null>;
}

function startChild(env: Record<string, string>): Child {
	// Node itself: a wrapper process would stand between our signals and the app.
	const { command, args } = serviceCommand(CHILD);
	const child = spawn(command, args, { cwd: path.join(__dirname, ".."), env: { ...process.env, ...env }, stdio: "pipe" });
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

// Durations short enough for a test: a delivery whose result was not written is due again once
// its 6 s lease ends.
const CRASH_TEST_ENV = {
	NODE_ENV: "test",
	SERVICES: "topics,webhooks,users,dispatcher",
	LOG_LEVEL: "error",
	WEBHOOK_ALLOW_NETS: "127.0.0.0/8",
	DELIVERY_RETRY_SCHEDULE: "1s,2s,3s,4s,5s",
	DELIVERY_POLL_INTERVAL: "100ms",
	DELIVERY_TIMEOUT: "2s",
	DELIVERY_LEASE: "6s",
	DELIVERY_CONCURRENCY: String(CONCURRENCY),
	DELIVERY_WEBHOOK_CONCURRENCY: String(CONCURRENCY),
};

/**
 * Waits until the child has created its webhook, published (and so persisted) every event, and
 * `arrived` deliveries reached the receiver. Returns the webhook's secret.
 */
async function publishedBy(child: Child, receiver: HttpsReceiver, arrived: number): Promise<string> {
	const webhookMessage = await waitUntil(() => child.messages.find(message => message.webhook), Boolean, "the child to create the webhook", 60_000);
	await waitUntil(() => child.messages.some(message => message.published), Boolean, "the child to publish every event", 60_000);
	await waitUntil(() => receiver.requests.length, count => count >= arrived, "some deliveries to arrive", 60_000);
	return webhookMessage!.webhook.secret;
}

/** Waits until every delivery reached the receiver and is recorded as succeeded, and verifies every request's signature. */
async function waitForEveryDelivery(receiver: HttpsReceiver, db: Knex, secret: string): Promise<void> {
	const distinctIds = () => new Set(receiver.requests.map(request => String(request.headers["webhook-id"]))).size;
	await waitUntil(distinctIds, count => count === EVENTS, "every delivery to reach the receiver", 120_000);
	const succeeded = () => db("deliveries").where({ status: "succeeded" }).count({ count: "*" });
	await waitUntil(succeeded, ([{ count }]) => Number(count) === EVENTS, "every delivery to be recorded as succeeded", 60_000);
	for (const request of receiver.requests) verifyDelivery(request, secret);
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
			...CRASH_TEST_ENV,
			DATA_DIR: dataDir,
			WEBHOOK_CA_FILE: receiver.writeCaFile(),
			...(schema ? { DATABASE_URL: TEST_DATABASE_URL, DATABASE_SCHEMA: schema } : {}),
		};

		const first = startChild({ ...env, CHILD_WEBHOOK_URL: `${receiver.url}/crash`, CHILD_PUBLISH: String(EVENTS) });
		children.push(first);
		const secret = await publishedBy(first, receiver, EVENTS / 6);
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
		await waitForEveryDelivery(receiver, db, secret);
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
	}, CRASH_TEST_BOUND_MS);
});

// The server programs are all this needs (it runs a PostgreSQL of its own); CI has them.
const describeWithPostgresPrograms = describeWhere({ programs: { "PostgreSQL's programs (initdb, pg_ctl)": postgresBinDir() !== undefined } });

describeWithPostgresPrograms("PostgreSQL crash under a running dispatcher", () => {
	let postgres: PostgresServer;
	let receiver: HttpsReceiver;
	let dataDir: string;
	let db: Knex | undefined;
	let child: Child | undefined;
	// While set, the receiver's answers wait for it: attempts stay in flight until it opens.
	let answersHeldUntil: Promise<void> | undefined;
	let heldAnswers = 0;

	beforeAll(async () => {
		postgres = await startPostgresServer();
		receiver = await startHttpsReceiver({
			respond: async () => {
				if (answersHeldUntil) {
					heldAnswers += 1;
					await answersHeldUntil;
				}
				return { status: 200, delayMs: 20 };
			},
		});
		dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-pgcrash-"));
	});
	afterAll(async () => {
		if (child && child.process.exitCode === null && child.process.signalCode === null) child.process.kill("SIGKILL");
		await child?.exited;
		await db?.destroy();
		await postgres?.close();
		await receiver?.close();
		fs.rmSync(dataDir, { recursive: true, force: true });
	});

	it("delivers every event after an immediate shutdown of PostgreSQL mid-run and its crash recovery", async () => {
		const env = { ...CRASH_TEST_ENV, DATA_DIR: dataDir, WEBHOOK_CA_FILE: receiver.writeCaFile(), DATABASE_URL: postgres.url };
		child = startChild({ ...env, CHILD_WEBHOOK_URL: `${receiver.url}/pg-crash`, CHILD_PUBLISH: String(EVENTS) });
		// Every event is acknowledged only once its delivery is committed (synchronously).
		const secret = await publishedBy(child, receiver, EVENTS / 4);

		// The crash lands while the dispatcher holds leased deliveries with attempts in flight:
		// the receiver keeps their answers until PostgreSQL is gone, so their results cannot be
		// written before it is back.
		let openAnswers!: () => void;
		answersHeldUntil = new Promise(resolve => (openAnswers = resolve));
		await waitUntil(() => heldAnswers, held => held > 0, "an attempt to wait for its answer", 60_000);
		await postgres.crash();
		const receivedAtCrash = receiver.requests.length;
		const inFlightAtCrash = heldAnswers;
		answersHeldUntil = undefined;
		openAnswers();
		await sleep(1_000);
		const receivedWhileDown = receiver.requests.length - receivedAtCrash;
		await postgres.start();
		const restartedAt = Date.now();

		db = knex({ client: "pg", connection: postgres.url, pool: { min: 0, max: 2 } });
		await waitForEveryDelivery(receiver, db, secret);
		expect(Number((await db("deliveries").count({ count: "*" }))[0].count)).toBe(EVENTS);

		const firstSentAt = new Map<string, number>();
		const repeated = new Set<string>();
		for (const request of receiver.requests) {
			const id = String(request.headers["webhook-id"]);
			if (firstSentAt.has(id)) repeated.add(id);
			else firstSentAt.set(id, request.receivedAt.getTime());
		}
		const repeats = receiver.requests.length - EVENTS;
		console.info(
			`PostgreSQL crash test: ${receivedAtCrash} requests before the immediate shutdown (${inFlightAtCrash} of them in flight), ${receivedWhileDown} while it was down, ` +
				`${receiver.requests.length} requests in all for ${EVENTS} deliveries: 0 lost, ${repeats} repeat(s) of ${repeated.size} deliveries`,
		);
		// The crash landed mid-run: deliveries had begun, some were still to make, and attempts
		// were in flight (the wait above made sure); every one of those was recorded in the end.
		expect(inFlightAtCrash).toBeGreaterThan(0);
		const distinctAtCrash = new Set(receiver.requests.slice(0, receivedAtCrash).map(request => String(request.headers["webhook-id"]))).size;
		expect(distinctAtCrash).toBeGreaterThan(0);
		expect(distinctAtCrash).toBeLessThan(EVENTS);
		// A repeat is an attempt whose result the crash took or could not write in time: first sent before PostgreSQL was back.
		for (const id of repeated) expect(firstSentAt.get(id)!).toBeLessThanOrEqual(restartedAt);

		child.process.kill("SIGTERM");
		expect(await child.exited).toBe(0);
	}, CRASH_TEST_BOUND_MS);
});
