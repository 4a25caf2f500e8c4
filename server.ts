// Entry point: `npm start` runs every service in one process (SQLite, no transporter);
// TRANSPORTER / DATABASE_URL / SMTP_URL / SERVICES turn the same code into a cluster node.
//
// The process either runs whole or stops, saying why: bad or missing variables exit 78 naming
// every one of them, as does a busy port; NATS or PostgreSQL that does not answer within
// STARTUP_CONNECT_TIMEOUT exits 69 naming TRANSPORTER or DATABASE_URL and the address; a NATS
// connection that gave up later exits 1 (so a supervisor restarts the node); and SIGTERM drains
// within SHUTDOWN_BOUND_MS whatever state NATS or the database is in. Once up, it prints where
// its endpoints are.
import type { AddressInfo } from "node:net";
import type { ServiceBroker } from "moleculer";
import { ConfigError, loadConfig } from "./lib/config";
import { natsClientsOf, type NatsClient } from "./lib/nats-clients";
import { DependencyUnavailableError, EXIT_UNAVAILABLE, waitForDependencies } from "./lib/startup-dependencies";
import { startupSummary } from "./lib/startup-summary";
import { createApp, type App } from "./app";

// sysexits.h EX_CONFIG.
const EXIT_CONFIG = 78;
// Below the 30 s that orchestrators (docker stop, Kubernetes) wait before SIGKILL.
const SHUTDOWN_BOUND_MS = 25_000;

/** The NATS connections this node depends on, to be watched for closing for good. */
function closableNatsConnections(broker: ServiceBroker): Array<[string, Required<Pick<NatsClient, "closed">>]> {
	const { transporter, intake } = natsClientsOf(broker);
	const named: Array<[string, NatsClient | null | undefined]> = [
		["transporter", transporter?.client],
		["intake channel", intake?.connection],
	];
	return named.filter((entry): entry is [string, Required<Pick<NatsClient, "closed">>] => typeof entry[1]?.closed === "function");
}

/** Stops for a reason the operator can act on: one message, no stack trace. */
function exitForStartupFailure(err: unknown): void {
	if (err instanceof ConfigError) {
		process.stderr.write(`${err.message}\n`);
		// Whatever did start (a database pool, a NATS connection) must not keep us alive.
		process.exit(EXIT_CONFIG);
	}
	if (err instanceof DependencyUnavailableError) {
		process.stderr.write(`${err.message}\n`);
		process.exit(EXIT_UNAVAILABLE);
	}
}

/** Where to go next: on standard output in development, as log lines in production (JSON). */
function announce(app: App): void {
	const ops = app.opsServer?.address() as AddressInfo | null | undefined;
	const lines = startupSummary(app.config, { api: app.apiPort(), ops: ops?.port });
	if (app.config.production) for (const line of lines) app.broker.logger.info(line.trim());
	else process.stdout.write(`\n${lines.join("\n")}\n\n`);
}

async function main(): Promise<void> {
	let app: App;
	try {
		const loaded = loadConfig(process.env);
		// Before the broker: moleculer and knex would fail (or retry for ever) without naming the setting.
		await waitForDependencies(loaded.config, line => process.stderr.write(`${line}\n`));
		// A service's created hook may still refuse the configuration (a ConfigError, exit 78).
		app = createApp(loaded.config, { ops: true });
		for (const warning of loaded.warnings) app.broker.logger.warn(warning);
	} catch (err) {
		exitForStartupFailure(err);
		throw err;
	}
	const logger = app.broker.logger;

	let stopping = false;
	const shutdown = async (reason: string, code: number) => {
		if (stopping) return;
		stopping = true;
		logger.info(`${reason}: stopping`);
		const bound = setTimeout(() => {
			logger.error(`Could not stop within ${SHUTDOWN_BOUND_MS / 1000} s; exiting anyway (unfinished leases expire and are taken over)`);
			process.exit(code || 1);
		}, SHUTDOWN_BOUND_MS);
		bound.unref();
		try {
			await app.stop();
		} catch (err) {
			logger.error("Error while stopping", err);
			code ||= 1;
		}
		process.exit(code);
	};
	process.on("SIGTERM", () => void shutdown("SIGTERM received", 0));
	process.on("SIGINT", () => void shutdown("SIGINT received", 0));

	try {
		await app.start();
	} catch (err) {
		exitForStartupFailure(err);
		throw err;
	}
	announce(app);

	// moleculer only logs a NATS client that gave up; a node that cannot hear the cluster must
	// stop, so that its supervisor restarts it.
	for (const [name, connection] of closableNatsConnections(app.broker)) {
		void connection.closed().then(() => {
			if (!stopping) {
				logger.fatal(`The NATS connection of the ${name} is closed for good`);
				void shutdown("NATS connection closed", 1);
			}
		});
	}
}

main().catch(err => {
	process.stderr.write(`Startup failed: ${err instanceof Error ? err.message : String(err)}\n`);
	process.exit(1);
});
