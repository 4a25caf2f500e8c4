// Entry point: `npm start` runs every service in one process (SQLite, no transporter);
// TRANSPORTER / DATABASE_URL / SMTP_URL / SERVICES turn the same code into a cluster node.
//
// The process either runs whole or stops: a bad variable or a busy port exits 78 naming it, a
// NATS connection that gave up exits 1 (so a supervisor restarts the node), and SIGTERM drains
// within SHUTDOWN_BOUND_MS whatever state NATS or the database is in.
import type { ServiceBroker } from "moleculer";
import { ConfigError, loadConfig } from "./lib/config";
import { natsClientsOf, type NatsClient } from "./lib/nats-clients";
import { createApp, type App } from "./app";

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

async function main(): Promise<void> {
	let loaded;
	try {
		loaded = loadConfig(process.env);
	} catch (err) {
		if (err instanceof ConfigError) {
			process.stderr.write(`${err.message}\n`);
			process.exit(EXIT_CONFIG);
		}
		throw err;
	}
	const app: App = createApp(loaded.config, { ops: true });
	const logger = app.broker.logger;
	for (const warning of loaded.warnings) logger.warn(warning);

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
		if (err instanceof ConfigError) {
			process.stderr.write(`${err.message}\n`);
			// Whatever did start (a database pool, a NATS connection) must not keep us alive.
			process.exit(EXIT_CONFIG);
		}
		throw err;
	}

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
