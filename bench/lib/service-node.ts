// Child process of bench/delivery.ts: one node of the service (as `npm start` or one role of
// `npm run cluster` runs it), configured by the environment the parent gives it, joined to the
// parent over NATS. Reports {nodeID} once started; answers "probe" with its event-loop figures.
import { createApp } from "../../app";
import { parseConfig, resolveSecrets } from "../../lib/config";
import { serveUntilStopped } from "./child";
import { startEventLoopProbe } from "./event-loop-probe";

async function main(): Promise<void> {
	const config = parseConfig(process.env);
	resolveSecrets(config);
	const app = createApp(config, { broker: { logger: { type: "Console", options: { level: "warn" } } } });
	await app.start();
	startEventLoopProbe();
	serveUntilStopped({ nodeID: app.broker.nodeID }, () => app.stop());
}

main().catch(err => {
	process.stderr.write(`bench service node failed: ${err instanceof Error ? err.stack : String(err)}\n`);
	process.exit(1);
});
