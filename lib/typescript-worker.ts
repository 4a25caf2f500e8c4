// Worker threads whose code is TypeScript, loaded the way the service loads its own: the compiled
// .js beside this file under `node dist/server.js`, else the .ts source through tsx (whether the
// parent runs under tsx, ts-jest or plain node), unless a transpiled copy was named.
import { Worker } from "node:worker_threads";
import { RUNNING_COMPILED, transpiledTwin } from "./project-root";

let transpiledCopy: string | null = null;

/**
 * Starts the threads of a process that runs from the TypeScript source from a transpiled copy of
 * the repository instead (the same layout, a .js for each .ts), rather than compiling them through
 * tsx, which costs a thread about 0.2 s of CPU at its start. The test suite makes one such copy
 * per run (test/helpers/service-build.ts) for the stacks it runs in its own processes.
 */
export function startWorkersFromCopy(copyRoot: string): void {
	transpiledCopy = copyRoot;
}

/** `entryFile` is the thread's .ts source; compiled, its .js twin runs instead. */
export function startTypeScriptWorker(entryFile: string, workerData: unknown): Worker {
	// Not the whole inherited execArgv: the parent's own loader flags would register tsx a second
	// time. Only a CPU profile (the benchmark's BENCH_PROFILE_DIR) is passed on, so that it covers
	// the threads as well as the main one.
	const execArgv = process.execArgv.filter(flag => flag.startsWith("--cpu-prof"));
	if (RUNNING_COMPILED) return new Worker(entryFile.replace(/\.ts$/, ".js"), { workerData, execArgv });
	if (transpiledCopy) return new Worker(transpiledTwin(transpiledCopy, entryFile), { workerData, execArgv });
	const bootstrap = `require("tsx/cjs/api").register(); require(${JSON.stringify(entryFile)});`;
	return new Worker(bootstrap, { eval: true, workerData, execArgv });
}
