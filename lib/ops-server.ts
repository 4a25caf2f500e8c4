// Unauthenticated operational endpoints on OPS_PORT: /health for orchestrators, /metrics for
// Prometheus. Kept off the public API port so they can stay behind the cluster network.
import http from "node:http";
import type { AddressInfo } from "node:net";
import type { ServiceBroker } from "moleculer";
import { metricsOf } from "./metrics";

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

export async function checkHealth(broker: ServiceBroker): Promise<HealthReport> {
	const checks: HealthReport["checks"] = {};
	if (broker.transit) {
		// moleculer only logs a NATS client that reached "closed"; the transit flags tell us.
		checks.transporter = { ok: Boolean(broker.transit.connected && !broker.transit.disconnecting) };
		if (!checks.transporter.ok) checks.transporter.detail = "not connected to the transporter";
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

export async function startOpsServer(broker: ServiceBroker, port: number, host: string): Promise<http.Server> {
	const server = http.createServer((req, res) => {
		const respond = async () => {
			if (req.url === "/health" || req.url === "/health/") {
				const report = await checkHealth(broker);
				res.writeHead(report.status === "ok" ? 200 : 503, { "content-type": "application/json" });
				res.end(JSON.stringify(report));
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
	await new Promise<void>(resolve => server.listen(port, host, resolve));
	broker.logger.info(`Ops endpoints (/health, /metrics) on port ${(server.address() as AddressInfo).port}`);
	return server;
}
