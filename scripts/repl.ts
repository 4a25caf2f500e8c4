// `npm run repl`: the Moleculer REPL with the operators' commands (lib/repl-commands.ts).
//
// - With TRANSPORTER set, it joins the cluster as a node that runs no service: it needs no
//   database, no secrets and no ops port, and its commands reach the services wherever they run.
// - Without it (the embedded default) the REPL is the service's own prompt: it starts every
//   configured service, exactly as `npm start`, with the prompt attached. A second one beside a
//   running service would fight over its ports and its SQLite file, so it stops at once, saying
//   what to do instead.
import net from "node:net";
import os from "node:os";
import { ConfigError, loadConfig, parseConfig, type AppConfig } from "../lib/config";
import { maskedUrl } from "../lib/connection-urls";
import { createApp } from "../app";

function portInUse(port: number, host: string): Promise<boolean> {
	if (port === 0) return Promise.resolve(false);
	return new Promise(resolve => {
		const probe = net.createServer();
		probe.once("error", (err: NodeJS.ErrnoException) => resolve(err.code === "EADDRINUSE"));
		probe.listen(port, host, () => probe.close(() => resolve(false)));
	});
}

async function busyPorts(config: AppConfig): Promise<string[]> {
	const busy: string[] = [];
	if (config.SERVICES.includes("api") && (await portInUse(config.PORT, config.HOST))) busy.push(`PORT ${config.PORT}`);
	if (await portInUse(config.OPS_PORT, config.HOST)) busy.push(`OPS_PORT ${config.OPS_PORT}`);
	return busy;
}

/** REPL logs stay quiet unless LOG_LEVEL asks otherwise: the prompt is for the operator. */
function replEnv(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
	return { ...env, LOG_LEVEL: env.LOG_LEVEL || "warn" };
}

async function joinCluster(env: NodeJS.ProcessEnv): Promise<void> {
	const config = parseConfig(env);
	// A node of its own: no service, so no database, no secrets and no ops endpoints.
	const node = createApp({ ...config, SERVICES: [], NODE_ID: config.NODE_ID ?? `repl-${os.hostname()}-${process.pid}` });
	await node.start();
	process.stdout.write(`Joined the cluster at ${maskedUrl(config.TRANSPORTER!)}${config.NAMESPACE ? ` (namespace ${config.NAMESPACE})` : ""} as ${node.broker.nodeID}, running no service. Type "help" for the commands.\n`);
	node.broker.repl();
}

async function runEmbedded(env: NodeJS.ProcessEnv): Promise<void> {
	const { config, warnings } = loadConfig(env);
	const busy = await busyPorts(config);
	if (busy.length) {
		process.stderr.write(
			`${busy.join(" and ")} ${busy.length > 1 ? "are" : "is"} already in use: is \`npm start\` (or another \`npm run repl\`) running?\n` +
				"In the embedded mode the REPL is the service's own prompt, so it cannot attach to another process.\n" +
				"Stop the running service and start it with the prompt instead: npm run repl\n" +
				"Or run the services as a cluster (TRANSPORTER=nats://…, see docs/cluster.md) and `npm run repl` joins it as a node running no service.\n",
		);
		process.exit(75);
	}
	const app = createApp(config, { ops: true });
	for (const warning of warnings) app.broker.logger.warn(warning);
	await app.start();
	process.stdout.write(`Services running: ${config.SERVICES.join(", ")} (API on port ${app.apiPort() ?? "-"}). Type "help" for the commands.\n`);
	app.broker.repl();
}

async function main(): Promise<void> {
	const env = replEnv(process.env);
	try {
		if (env.TRANSPORTER) await joinCluster(env);
		else await runEmbedded(env);
	} catch (err) {
		if (err instanceof ConfigError) {
			process.stderr.write(`${err.message}\n`);
			process.exit(78);
		}
		throw err;
	}
}

main().catch(err => {
	process.stderr.write(`REPL failed to start: ${err instanceof Error ? err.message : String(err)}\n`);
	process.exit(1);
});
