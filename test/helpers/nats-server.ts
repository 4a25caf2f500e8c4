// A NATS server with JetStream that belongs to one test: its own `nats-server -js` process on a
// free loopback port, with its own store directory. The test may stop it (SIGKILL, like a crash)
// and start it again on the same port and store, which the machine's shared NATS must never see.
//
//   const nats = await startNatsServer();
//   nats.url                       // nats://127.0.0.1:<port>
//   await nats.stop();             // SIGKILL; clients see the connection drop
//   await nats.start();            // same port, same store: streams and consumers survive
//   await nats.close();            // stops it and removes the store
//   const env = await nats.startTls(dir);  // again, with mutual TLS: TRANSPORTER, NATS_CA_FILE…
import { setTimeout as sleep } from "node:timers/promises";
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import type { NatsFiles } from "../../lib/connection-urls";
import { ensureDevelopmentCertificates } from "../../lib/dev-certificates";
import { freePort } from "./net";

export const NATS_SERVER_BIN = process.env.NATS_SERVER_BIN ?? "/usr/sbin/nats-server";

/** How a node reaches a NATS server: the variables it gets, TRANSPORTER and for TLS its files. */
export type NatsEnv = NatsFiles & { TRANSPORTER: string };

export interface NatsServer {
	readonly port: number;
	readonly url: string;
	readonly storeDir: string;
	readonly logFile: string;
	readonly running: boolean;
	/**
	 * Starts it (again); `extraArgs` are passed to nats-server, e.g. to demand credentials. Without
	 * them, a server that startTls made starts with TLS again.
	 */
	start(extraArgs?: string[]): Promise<void>;
	/** Kills the server (SIGKILL by default, as a crash; SIGTERM for a clean stop) and waits for it. */
	stop(signal?: NodeJS.Signals): Promise<void>;
	/** Stops the server and removes its store and log. */
	close(): Promise<void>;
	/**
	 * Starts it again with TLS only, its certificate signed by a CA made in `dir`, demanding a
	 * client certificate of that CA. Returns the variables a node needs to join it.
	 */
	startTls(dir: string): Promise<NatsEnv>;
	/** The clients connected now, from the server's monitoring endpoint (/connz). */
	connections(): Promise<Array<{ name?: string; tls_version?: string }>>;
}

function accepts(port: number): Promise<boolean> {
	return new Promise(resolve => {
		const socket = net.connect({ host: "127.0.0.1", port });
		socket.once("connect", () => {
			socket.destroy();
			resolve(true);
		});
		socket.once("error", () => resolve(false));
	});
}

async function jetStreamReady(monitorPort: number): Promise<boolean> {
	try {
		const response = await fetch(`http://127.0.0.1:${monitorPort}/healthz?js-enabled=true`);
		return response.status === 200;
	} catch {
		return false;
	}
}

export async function startNatsServer(): Promise<NatsServer> {
	if (!fs.existsSync(NATS_SERVER_BIN)) throw new Error(`nats-server not found at ${NATS_SERVER_BIN} (install Debian's nats-server, or set NATS_SERVER_BIN)`);
	const root = fs.mkdtempSync(path.join(os.tmpdir(), "swh-nats-"));
	const storeDir = path.join(root, "store");
	const logFile = path.join(root, "nats-server.log");
	const port = await freePort();
	const monitorPort = await freePort();
	let child: ChildProcess | undefined;
	let exited: Promise<void> = Promise.resolve();
	let closed = false;
	let standingArgs: string[] = [];

	const server: NatsServer = {
		port,
		url: `nats://127.0.0.1:${port}`,
		storeDir,
		logFile,
		get running() {
			return child !== undefined && child.exitCode === null && child.signalCode === null;
		},
		async start(extraArgs: string[] = standingArgs) {
			if (closed) throw new Error(`nats-server on port ${port} was closed`);
			if (server.running) return;
			const log = fs.openSync(logFile, "a");
			const args = ["-js", "-sd", storeDir, "-a", "127.0.0.1", "-p", String(port), "-m", String(monitorPort), ...extraArgs];
			const started = spawn(NATS_SERVER_BIN, args, { stdio: ["ignore", log, log] });
			fs.closeSync(log);
			child = started;
			exited = new Promise(resolve => started.once("exit", () => resolve()));
			for (let i = 0; i < 200; i++) {
				if (started.exitCode !== null) break;
				if ((await accepts(port)) && (await jetStreamReady(monitorPort))) return;
				await sleep(50);
			}
			started.kill("SIGKILL");
			await exited;
			throw new Error(`nats-server did not come up on port ${port}:\n${tailOf(logFile)}`);
		},
		async stop(signal = "SIGKILL") {
			if (!server.running) return exited;
			child!.kill(signal);
			await exited;
		},
		async startTls(dir) {
			const { caFile, certFile, keyFile } = ensureDevelopmentCertificates(dir);
			await server.stop();
			standingArgs = ["--tlsverify", "--tlscert", certFile, "--tlskey", keyFile, "--tlscacert", caFile];
			await server.start();
			// The development certificate serves for either end (it allows clientAuth too).
			return { TRANSPORTER: `tls://127.0.0.1:${port}`, NATS_CA_FILE: caFile, NATS_CERT_FILE: certFile, NATS_KEY_FILE: keyFile };
		},
		async connections() {
			const response = await fetch(`http://127.0.0.1:${monitorPort}/connz?limit=1024`);
			return ((await response.json()) as { connections?: Array<{ name?: string; tls_version?: string }> }).connections ?? [];
		},
		async close() {
			closed = true;
			await server.stop();
			fs.rmSync(root, { recursive: true, force: true });
		},
	};
	await server.start();
	return server;
}

/** The last lines of a log file, for failure messages. */
export function tailOf(file: string, lines = 40): string {
	try {
		return fs.readFileSync(file, "utf8").split("\n").slice(-lines).join("\n");
	} catch {
		return "(no log)";
	}
}
