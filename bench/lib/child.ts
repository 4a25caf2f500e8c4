// Runs a benchmark's server in a child process. On a 2-core machine this gives the server under
// test one core and the load generator (in the parent) the other, instead of both fighting
// over one event loop, which would measure the load generator as much as the server.
import { fork, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import { transpiledTwin } from "../../lib/project-root";
import { TRANSPILED_COPY_VARIABLE, transpileRepository } from "./transpiled-copy";

export interface ChildServer<Ready> {
	/** What the child reported once it was ready (e.g. its port). */
	ready: Ready;
	process: ChildProcess;
	stop(): Promise<void>;
}

const STOP_GRACE_MS = 15_000;
// Every child still running, so that a run stopped by a signal can stop them before it cleans up.
const running = new Set<() => Promise<void>>();

/**
 * The transpiled copy the children run from: the one named by BENCH_TRANSPILED_COPY (the test
 * suite passes its run's copy), else one made at the first child and removed when this process
 * exits.
 */
function childrenCopy(): string {
	const named = process.env[TRANSPILED_COPY_VARIABLE];
	if (named) return named;
	const copy = transpileRepository(".bench-build-");
	process.once("exit", () => fs.rmSync(copy, { recursive: true, force: true }));
	process.env[TRANSPILED_COPY_VARIABLE] = copy;
	process.stderr.write(`bench: the child processes run from ${copy}, transpiled from the source; removed at exit\n`);
	return copy;
}

/**
 * Forks `script` (a TypeScript file of bench/lib, run from its transpiled twin) with `env` added
 * to this process's environment, and waits for its first IPC message. The script reports
 * readiness with `process.send(...)` and should stop cleanly on SIGTERM.
 */
export function startChild<Ready>(script: string, env: Record<string, string>, timeoutMs = 120_000, nodeOptions: string[] = []): Promise<ChildServer<Ready>> {
	const child = fork(transpiledTwin(childrenCopy(), script), [], {
		env: { ...process.env, ...env },
		execArgv: nodeOptions,
		// The child's logs join ours on stderr; stdout stays clean for the JSON result.
		stdio: ["ignore", process.stderr, process.stderr, "ipc"],
	});
	const exited = new Promise<void>(resolve => child.once("exit", () => resolve()));
	const stop = async () => {
		if (child.exitCode !== null || child.signalCode !== null) return;
		child.kill("SIGTERM");
		const timer = setTimeout(() => child.kill("SIGKILL"), STOP_GRACE_MS);
		await exited;
		clearTimeout(timer);
	};
	// Kept until the child exits, however that comes about.
	running.add(stop);
	void exited.then(() => running.delete(stop));
	return new Promise((resolve, reject) => {
		const timer = setTimeout(() => {
			void stop();
			reject(new Error(`${script} did not report ready within ${timeoutMs} ms`));
		}, timeoutMs);
		child.once("message", message => {
			clearTimeout(timer);
			resolve({ ready: message as Ready, process: child, stop });
		});
		child.once("exit", code => {
			clearTimeout(timer);
			reject(new Error(`${script} exited with code ${code} before it was ready`));
		});
	});
}

/** Stops every child this process started and has not stopped yet. */
export async function stopAllChildren(): Promise<void> {
	await Promise.all([...running].map(stop => stop()));
}

/** For the child side: report readiness, and stop `shutdown` on SIGTERM or when the parent goes. */
export function serveUntilStopped(ready: unknown, shutdown: () => Promise<void>): void {
	let stopping = false;
	const stop = () => {
		if (stopping) return;
		stopping = true;
		shutdown()
			.catch(err => process.stderr.write(`shutdown failed: ${String(err)}\n`))
			.finally(() => process.exit(0));
	};
	process.on("SIGTERM", stop);
	process.on("disconnect", stop);
	process.send?.(ready);
}
