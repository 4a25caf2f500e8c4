// Child process of bench/api.ts: the real service stack (all services, embedded SQLite), with the
// configuration the parent put in the environment. Reports {port} when it listens.
import { loadConfig } from "../../lib/config";
import { createApp } from "../../app";
import { serveUntilStopped } from "./child";

async function main(): Promise<void> {
	const { config } = loadConfig(process.env);
	const app = createApp(config, { broker: { logger: false } });
	await app.start();
	serveUntilStopped({ port: app.apiPort() }, () => app.stop());
}

main().catch(err => {
	process.stderr.write(`bench api server failed: ${err instanceof Error ? err.stack : String(err)}\n`);
	process.exit(1);
});
