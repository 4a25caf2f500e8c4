// Entry point: `npm start` runs every service in one process (SQLite, no transporter);
// TRANSPORTER / DATABASE_URL / SMTP_URL / SERVICES turn the same code into a cluster node.
import { ConfigError, loadConfig } from "./lib/config";
import { createApp } from "./app";

async function main(): Promise<void> {
	let loaded;
	try {
		loaded = loadConfig(process.env);
	} catch (err) {
		if (err instanceof ConfigError) {
			process.stderr.write(`${err.message}\n`);
			process.exit(78);
		}
		throw err;
	}
	const app = createApp(loaded.config, { ops: true });
	for (const warning of loaded.warnings) app.broker.logger.warn(warning);

	let stopping = false;
	const shutdown = async (signal: string) => {
		if (stopping) return;
		stopping = true;
		app.broker.logger.info(`${signal} received, stopping`);
		await app.stop().catch(err => app.broker.logger.error("Error while stopping", err));
		process.exit(0);
	};
	process.on("SIGTERM", () => void shutdown("SIGTERM"));
	process.on("SIGINT", () => void shutdown("SIGINT"));

	await app.start();
	if (process.env.REPL === "1") app.broker.repl();
}

main().catch(err => {
	process.stderr.write(`Startup failed: ${err instanceof Error ? err.message : String(err)}\n`);
	process.exit(1);
});
