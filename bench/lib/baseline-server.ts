// Child process of bench/api.ts: the baseline. A bare moleculer-web gateway (default broker
// options, no authentication, no database, no validation) whose GET /id/v3/webhooks calls an
// action answering a constant page shaped and sized like a real page of 25 webhooks. Comparing
// with it shows what authentication, validation and the database cost on top of the framework.
import http from "node:http";
import { ServiceBroker } from "moleculer";
import ApiGateway from "moleculer-web";
import { serveUntilStopped } from "./child";
import { TASKING_ORDER_STATUS_TOPIC } from "../../lib/schemas/events";

const PAGE_SIZE = 25;
const CONSTANT_PAGE = {
	webhooks: Array.from({ length: PAGE_SIZE }, (_, i) => ({
		id: `00000000-0000-4000-8000-${String(i).padStart(12, "0")}`,
		name: `Seeded webhook ${i}`,
		url: `https://hooks.example.com/seed/${i}`,
		events: [TASKING_ORDER_STATUS_TOPIC],
		active: true,
		created_at: "2026-01-01T00:00:00.000Z",
		updated_at: "2026-01-01T00:00:00.000Z",
	})),
	context: { per_page: PAGE_SIZE, matched: PAGE_SIZE, returned: PAGE_SIZE },
	links: [],
};

async function main(): Promise<void> {
	const broker = new ServiceBroker({ logger: false });
	broker.createService({ name: "baseline", actions: { list: () => CONSTANT_PAGE } });
	broker.createService({
		name: "api",
		mixins: [ApiGateway],
		settings: {
			port: 0,
			ip: "127.0.0.1",
			routes: [{ path: "/id/v3", mappingPolicy: "restrict", autoAliases: false, aliases: { "GET /webhooks": "baseline.list" } }],
		},
	});
	await broker.start();
	const gateway = broker.getLocalService("api") as unknown as { server: http.Server };
	const address = gateway.server.address();
	serveUntilStopped({ port: typeof address === "object" && address ? address.port : 0 }, () => broker.stop());
}

main().catch(err => {
	process.stderr.write(`bench baseline server failed: ${err instanceof Error ? err.stack : String(err)}\n`);
	process.exit(1);
});
