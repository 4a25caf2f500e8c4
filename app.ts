// Builds a broker with the services this process should run (SERVICES), for the server entry
// point, the tests and the benchmarks alike.
import http from "node:http";
import { ServiceBroker, type BrokerOptions, type ServiceSchema } from "moleculer";
import { attachConfig, listenError, type AppConfig, type ServiceName } from "./lib/config";
import { enableProcessMetrics } from "./lib/metrics";
import { startOpsServer } from "./lib/ops-server";
import { flushTracing, startTracing } from "./lib/tracing";
import { brokerOptions } from "./moleculer.config";

// Loaded lazily so that e.g. SERVICES=dispatcher does not load the gateway's dependencies.
const SERVICE_LOADERS: Record<ServiceName, () => ServiceSchema> = {
	api: () => require("./services/api.service").default,
	topics: () => require("./services/topics.service").default,
	webhooks: () => require("./services/webhooks.service").default,
	users: () => require("./services/users.service").default,
	dispatcher: () => require("./services/dispatcher.service").default,
	notifier: () => require("./services/notifier.service").default,
};

export interface App {
	broker: ServiceBroker;
	config: AppConfig;
	start(): Promise<void>;
	stop(): Promise<void>;
	/** The gateway's listening port once started (useful with PORT=0). */
	apiPort(): number | undefined;
	opsServer?: http.Server;
}

export interface AppOptions {
	broker?: Partial<BrokerOptions>;
	/** Start the /health and /metrics server (the server entry point does; tests usually don't). */
	ops?: boolean;
}

/**
 * moleculer-web only logs a listen error and its start never settles, which left a process with
 * no API running the other services. This rejects instead, so that start-up stops.
 */
function gatewayListenFailure(broker: ServiceBroker, port: number, host: string): Promise<never> {
	return new Promise((_resolve, reject) => {
		const server = (broker.getLocalService("api") as unknown as { server?: http.Server } | undefined)?.server;
		if (!server) return;
		// moleculer-web's own listener logs a stack trace and nothing else.
		server.removeAllListeners("error");
		server.on("error", err => {
			if (!server.listening) reject(listenError("PORT", port, host, err));
			else broker.logger.error(`Gateway server error: ${err.message}`);
		});
	});
}

export function createApp(config: AppConfig, options: AppOptions = {}): App {
	// Before the broker: its options take the tracing middleware when an OTLP endpoint is set.
	startTracing(config);
	const broker = new ServiceBroker(brokerOptions(config, options.broker));
	attachConfig(broker, config);
	for (const name of config.SERVICES) broker.createService(SERVICE_LOADERS[name]());

	const app: App = {
		broker,
		config,
		async start() {
			// Bound first: a busy OPS_PORT stops the process before it joins the cluster.
			if (options.ops) app.opsServer = await startOpsServer(broker, config.OPS_PORT, config.HOST);
			await Promise.race([broker.start(), gatewayListenFailure(broker, config.PORT, config.HOST)]);
			if (options.ops) enableProcessMetrics(broker);
			const port = app.apiPort();
			if (port !== undefined) config.boundBaseUrl = `http://localhost:${port}`;
		},
		async stop() {
			if (app.opsServer) await new Promise(resolve => app.opsServer!.close(resolve));
			await broker.stop();
			// The spans of the last requests and attempts, before the process goes.
			await flushTracing();
		},
		apiPort() {
			const api = broker.getLocalService("api") as unknown as { server?: http.Server } | undefined;
			const address = api?.server?.address();
			return address && typeof address === "object" ? address.port : undefined;
		},
	};
	return app;
}
