// Unauthenticated operational endpoints on OPS_PORT: /health for orchestrators, /metrics for
// Prometheus. Kept off the public API port so they can stay behind the cluster network. The
// health report's details (node id, which carries the host name; services; checks) go only to a
// loopback caller or one with a valid bearer token: anyone else gets the status alone.
import http from "node:http";
import type { AddressInfo } from "node:net";
import ipaddr from "ipaddr.js";
import type { ServiceBroker } from "moleculer";
import { metricsOf } from "./metrics";
import { answersWithin, natsClientsOf } from "./nats-clients";
import { configOf, listenError } from "./config";
import type { TokenVerifier } from "./auth";

export interface HealthReport {
	status: "ok" | "unavailable";
	node: string;
	services: string[];
	checks: Record<string, { ok: boolean; detail?: string }>;
}

interface ServiceWithDb {
	name: string;
	db?: { raw(sql: string): Promise<unknown> };
}

const TRANSPORTER_PING_TIMEOUT_MS = 1_000;

/**
 * moleculer keeps its `connected` flags up while the NATS client reconnects (forever, by
 * default) and only logs a client that reached "closed", so the flags cannot tell an outage.
 * A PING/PONG round trip can: while the client is cut off, the flush waits for a reconnect.
 */
async function transporterAnswers(broker: ServiceBroker): Promise<boolean> {
	const { transporter } = natsClientsOf(broker);
	const client = transporter?.client;
	if (!client || typeof client.flush !== "function" || typeof client.isClosed !== "function") return Boolean(transporter?.connected);
	return answersWithin(client, TRANSPORTER_PING_TIMEOUT_MS);
}

export async function checkHealth(broker: ServiceBroker): Promise<HealthReport> {
	const checks: HealthReport["checks"] = {};
	if (broker.transit) {
		checks.transporter = { ok: Boolean(broker.transit.connected && !broker.transit.disconnecting) && (await transporterAnswers(broker)) };
		if (!checks.transporter.ok) checks.transporter.detail = "not connected to the transporter";
	}
	// Cluster nodes have the channel adapter; it connects only after the services have started.
	const adapter = natsClientsOf(broker).intake;
	if (adapter) {
		const connection = adapter.connection;
		const closed = Boolean(connection && typeof connection.isClosed === "function" && connection.isClosed());
		checks.intake = { ok: Boolean(adapter.connected) && !closed };
		if (!checks.intake.ok) checks.intake.detail = closed ? "the JetStream intake connection is closed" : "not yet connected to the JetStream intake";
	}
	const local = broker.services as unknown as ServiceWithDb[];
	const withDb = local.find(service => service.db);
	if (withDb?.db) {
		try {
			await withDb.db.raw("select 1");
			checks.database = { ok: true };
		} catch {
			checks.database = { ok: false, detail: "database did not answer" };
		}
	}
	const ok = Object.values(checks).every(check => check.ok) && broker.started;
	return {
		status: ok ? "ok" : "unavailable",
		node: broker.nodeID,
		services: local.map(service => service.name).filter(name => !name.startsWith("$")),
		checks,
	};
}

function isLoopback(address: string | undefined): boolean {
	try {
		return address !== undefined && ipaddr.process(address).range() === "loopback";
	} catch {
		return false;
	}
}

/** Whether this caller may see the health report's details. */
async function mayReadDetails(req: http.IncomingMessage, verifier: () => TokenVerifier | undefined): Promise<boolean> {
	if (isLoopback(req.socket.remoteAddress)) return true;
	const token = /^Bearer +(\S+)$/i.exec(req.headers.authorization ?? "")?.[1];
	const verify = token ? verifier() : undefined;
	if (!token || !verify) return false;
	return verify(token).then(
		() => true,
		() => false,
	);
}

export async function startOpsServer(broker: ServiceBroker, port: number, host: string): Promise<http.Server> {
	let verifier: TokenVerifier | undefined;
	const tokenVerifier = () => {
		try {
			// Loaded on the first remote caller with a token: a dispatcher or notifier otherwise never
			// verifies one, and jose and the auth module cost it about 55 ms of CPU at every start.
			const { createTokenVerifier } = require("./auth") as typeof import("./auth");
			verifier ??= createTokenVerifier(configOf(broker));
		} catch {
			// No token configuration in this process: only loopback callers see details.
		}
		return verifier;
	};
	const server = http.createServer((req, res) => {
		const respond = async () => {
			if (req.url === "/health" || req.url === "/health/") {
				const report = await checkHealth(broker);
				const body = (await mayReadDetails(req, tokenVerifier)) ? report : { status: report.status };
				res.writeHead(report.status === "ok" ? 200 : 503, { "content-type": "application/json", "cache-control": "no-store", "x-content-type-options": "nosniff" });
				res.end(JSON.stringify(body));
			} else if (req.url === "/metrics") {
				const registry = metricsOf(broker);
				res.writeHead(200, { "content-type": registry.contentType });
				res.end(await registry.metrics());
			} else {
				res.writeHead(404, { "content-type": "application/json" });
				res.end(JSON.stringify({ status: 404, title: "Not Found" }));
			}
		};
		respond().catch(() => {
			res.writeHead(500);
			res.end();
		});
	});
	await new Promise<void>((resolve, reject) => {
		server.once("error", err => reject(listenError("OPS_PORT", port, host, err)));
		server.listen(port, host, resolve);
	});
	broker.logger.info(`Ops endpoints (/health, /metrics) on port ${(server.address() as AddressInfo).port}`);
	return server;
}
