// Entry point: `npm start` runs every service in one process (SQLite, no transporter);
// TRANSPORTER / DATABASE_URL / SMTP_URL / SERVICES turn the same code into a cluster node.
//
// The process either runs whole or stops: a bad variable or a busy port exits 78 naming it, a
// NATS connection that gave up exits 1 (so a supervisor restarts the node), and SIGTERM drains
// within SHUTDOWN_BOUND_MS whatever state NATS or the database is in.
import type { ServiceBroker } from "moleculer";
import { ConfigError, loadConfig } from "./lib/config";
import { createApp, type App } from "./app";

const EXIT_CONFIG = 78;
// Below the 30 s that orchestrators (docker stop, Kubernetes) wait before SIGKILL.
const SHUTDOWN_BOUND_MS = 25_000;

interface ClosableConnection {
	closed(): Promise<void | Error>;
}

/** The NATS connections this node depends on: moleculer's transporter and the channel adapter. */
function natsConnections(broker: ServiceBroker): Array<[string, ClosableConnection]> {
	const transporter = (broker.transit?.tx as unknown as { client?: ClosableConnection } | undefined)?.client;
	const channels = (broker as unknown as { channelAdapter?: { connection?: ClosableConnection } }).channelAdapter?.connection;
	const found: Array<[string, ClosableConnection]> = [];
	if (transporter && typeof transporter.closed === "function") found.push(["transporter", transporter]);
	if (channels && typeof channels.closed === "function") found.push(["intake channel", channels]);
	return found;
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
	for (const [name, connection] of natsConnections(app.broker)) {
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
