// Broker options derived from the validated configuration. The same code runs embedded (no
// transporter: all services in one process) and distributed (NATS between processes).
import type { BrokerOptions, Middleware } from "moleculer";
import type { AppConfig } from "./lib/config";
import { natsServerOptions } from "./lib/connection-urls";
import { ZodValidator } from "./mixins/validation";
import { logFormatter, RequestScopeMiddleware } from "./lib/logging";
import { replCommands } from "./lib/repl-commands";
import { tracingMiddleware } from "./lib/tracing";

/** The durable intake's middlewares, loaded with nats.js only by a cluster node. */
function intakeMiddlewaresOf(config: AppConfig): Middleware[] {
	if (!config.TRANSPORTER) return [];
	const { intakeMiddlewares } = require("./lib/intake-jetstream") as typeof import("./lib/intake-jetstream");
	return intakeMiddlewares(config);
}

export function brokerOptions(config: AppConfig, overrides: Partial<BrokerOptions> = {}): BrokerOptions {
	const tracing = tracingMiddleware();
	return {
		namespace: config.NAMESPACE,
		nodeID: config.NODE_ID,
		// The servers, credentials and TLS as the intake takes them (moleculer would read the URL's
		// credentials itself, but not percent-decode them).
		transporter: config.TRANSPORTER ? { type: "NATS", options: natsServerOptions(config.TRANSPORTER, config) } : undefined,
		logger: {
			type: "Console",
			// JSON lines in production; every line carries the request id of the call that caused it.
			options: { level: config.LOG_LEVEL, formatter: logFormatter(config.NODE_ENV === "production"), colors: false },
		},
		serializer: "JSON",
		requestTimeout: 30_000,
		retryPolicy: { enabled: false },
		// A caller waiting on a dead node should fail over quickly rather than hang.
		heartbeatInterval: 5,
		heartbeatTimeout: 15,
		tracking: { enabled: true, shutdownTimeout: 10_000 },
		// Keep local calls local: disableBalancer would route them over NATS too.
		disableBalancer: false,
		registry: { strategy: "RoundRobin", preferLocal: true },
		circuitBreaker: { enabled: false },
		validator: new ZodValidator(),
		// The request id on every log line; cluster nodes also reach the durable intake channel on
		// JetStream (lib/intake-jetstream.ts); with an OTLP endpoint, the trace context rides along
		// calls, events and channel messages (lib/tracing.ts).
		middlewares: [RequestScopeMiddleware, ...intakeMiddlewaresOf(config), ...(tracing ? [tracing] : [])],
		// Operators' commands for `npm run repl` (lib/repl-commands.ts).
		replCommands: replCommands(),
		// server.ts handles SIGTERM and SIGINT itself, with a bound; moleculer's own handlers
		// would stop the broker a second time.
		skipProcessEventRegistration: true,
		metrics: { enabled: false },
		errorHandler(err) {
			throw err;
		},
		...overrides,
	};
}

export default brokerOptions;
