// The operational endpoints on OPS_PORT: /health for orchestrators (and what makes it fail),
// /metrics for Prometheus. They answer without a token and live apart from the API port.
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { createApp, type App } from "../app";
import { parseConfig, resolveSecrets, ALL_SERVICES } from "../lib/config";
import { dropTestSchema, natsEnabled, testDatabases, TEST_DATABASE_URL, type DatabaseKind } from "./helpers/services";
import { startNatsServer } from "./helpers/nats-server";

interface OpsApp {
	app: App;
	opsUrl: string;
	apiUrl: string;
	dataDir: string;
	stop(): Promise<void>;
}

async function startWithOps(database: DatabaseKind, env: Record<string, string> = {}): Promise<OpsApp> {
	const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-ops-"));
	const schema = database === "postgres" ? `t_${crypto.randomBytes(6).toString("hex")}` : undefined;
	const config = parseConfig({
		NODE_ENV: "test",
		PORT: "0",
		OPS_PORT: "0",
		HOST: "127.0.0.1",
		DATA_DIR: dataDir,
		...(schema ? { DATABASE_URL: TEST_DATABASE_URL, DATABASE_SCHEMA: schema } : {}),
		...env,
	});
	resolveSecrets(config);
	const app = createApp(config, { ops: true, broker: { logger: false } });
	await app.start();
	const address = app.opsServer!.address() as net.AddressInfo;
	return {
		app,
		opsUrl: `http://127.0.0.1:${address.port}`,
		apiUrl: `http://127.0.0.1:${app.apiPort()}`,
		dataDir,
		async stop() {
			await app.stop();
			if (schema && config.DATABASE_URL) {
				await dropTestSchema(schema);
			}
			fs.rmSync(dataDir, { recursive: true, force: true });
		},
	};
}

/** Polls (bounded) until `check` holds, for states that settle asynchronously. */
async function eventually<T>(read: () => Promise<T>, check: (value: T) => boolean, attempts = 100): Promise<T> {
	let value = await read();
	for (let i = 0; i < attempts && !check(value); i++) {
		await sleep(200);
		value = await read();
	}
	return value;
}

const getJson = async (url: string) => {
	const response = await fetch(url);
	return { status: response.status, type: response.headers.get("content-type"), body: (await response.json()) as Record<string, any> };
};

describe.each(testDatabases())("ops endpoints (%s)", database => {
	let ops: OpsApp;

	beforeAll(async () => {
		ops = await startWithOps(database);
	});
	afterAll(() => ops.stop());

	it("reports health with every local service and a working database", async () => {
		for (const suffix of ["/health", "/health/"]) {
			const health = await getJson(ops.opsUrl + suffix);
			expect(health.status).toBe(200);
			expect(health.type).toContain("application/json");
			expect(health.body).toEqual({
				status: "ok",
				node: ops.app.broker.nodeID,
				services: expect.arrayContaining([...ALL_SERVICES]),
				checks: { database: { ok: true } },
			});
		}
	});

	it("serves Prometheus metrics: process metrics and the delivery metrics", async () => {
		const response = await fetch(`${ops.opsUrl}/metrics`);
		expect(response.status).toBe(200);
		expect(response.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);
		const text = await response.text();
		for (const name of ["process_cpu_user_seconds_total", "nodejs_eventloop_lag_seconds", "webhook_delivery_attempts_total"]) {
			expect(text).toMatch(new RegExp(`^# TYPE ${name} `, "m"));
		}
	});

	it("keeps ops and API apart: no /health on the API port, no API on the ops port", async () => {
		const onApi = await fetch(`${ops.apiUrl}/health`);
		expect(onApi.status).toBe(404);
		const onOps = await getJson(`${ops.opsUrl}/id/v3/webhooks`);
		expect(onOps.status).toBe(404);
	});
});

describe("health when a dependency is down", () => {
	it("answers 503 once the PostgreSQL connection is cut, and 200 again when it is back", async () => {
		if (!testDatabases().includes("postgres")) return console.warn("PostgreSQL not reachable: database health check not exercised");
		// A TCP relay between the service and PostgreSQL that the test can cut, like a network failure.
		const upstream = new URL(TEST_DATABASE_URL);
		const sockets = new Set<net.Socket>();
		let accepting = true;
		const relay = net.createServer(client => {
			if (!accepting) return client.destroy();
			const server = net.connect(Number(upstream.port || 5432), upstream.hostname);
			for (const socket of [client, server]) {
				sockets.add(socket);
				socket.on("close", () => sockets.delete(socket));
				socket.on("error", () => socket.destroy());
			}
			client.pipe(server).pipe(client);
		});
		await new Promise<void>(resolve => relay.listen(0, "127.0.0.1", resolve));
		const relayUrl = new URL(TEST_DATABASE_URL);
		relayUrl.port = String((relay.address() as net.AddressInfo).port);

		const schema = `t_${crypto.randomBytes(6).toString("hex")}`;
		const ops = await startWithOps("sqlite", { DATABASE_URL: relayUrl.toString(), DATABASE_SCHEMA: schema, SERVICES: "topics" });
		try {
			expect((await getJson(`${ops.opsUrl}/health`)).status).toBe(200);
			accepting = false;
			for (const socket of sockets) socket.destroy();
			const down = await eventually(() => getJson(`${ops.opsUrl}/health`), health => health.status === 503, 20);
			expect(down.status).toBe(503);
			expect(down.body).toMatchObject({ status: "unavailable", checks: { database: { ok: false, detail: expect.any(String) } } });
			expect(JSON.stringify(down.body)).not.toContain(String(upstream.port || 5432));

			accepting = true;
			const back = await eventually(() => getJson(`${ops.opsUrl}/health`), health => health.status === 200, 20);
			expect(back.status).toBe(200);
		} finally {
			accepting = true;
			await ops.app.stop();
			await dropTestSchema(schema);
			fs.rmSync(ops.dataDir, { recursive: true, force: true });
			await new Promise(resolve => relay.close(resolve));
		}
	});

	it("answers 503 while the node has lost its NATS server, and 200 once it is back", async () => {
		if (!natsEnabled()) return console.warn("NATS not reachable: transporter health check not exercised");
		// A NATS server of this test's own, so that stopping it disturbs nobody else.
		const nats = await startNatsServer();
		const ops = await startWithOps("sqlite", { TRANSPORTER: nats.url, SERVICES: "topics", NAMESPACE: `ops-${nats.port}` });
		try {
			const healthy = await getJson(`${ops.opsUrl}/health`);
			expect(healthy.body.checks).toEqual({ transporter: { ok: true }, intake: { ok: true }, database: { ok: true } });

			await nats.stop();
			const down = await eventually(() => getJson(`${ops.opsUrl}/health`), health => health.status === 503, 50);
			expect(down.status).toBe(503);
			expect(down.body).toMatchObject({ status: "unavailable", checks: { transporter: { ok: false, detail: expect.any(String) }, database: { ok: true } } });

			// The client reconnects by itself (and only a connected broker can stop cleanly).
			await nats.start();
			const back = await eventually(() => getJson(`${ops.opsUrl}/health`), health => health.status === 200, 100);
			expect(back.body.checks.transporter).toEqual({ ok: true });
		} finally {
			await ops.stop();
			await nats.close();
		}
	});
});

