// Worker threads whose code is TypeScript, loaded the way the service loads its own: the compiled
// .js beside this file under `node dist/server.js`, else the .ts source through tsx (whether the
// parent runs under tsx, ts-jest or plain node).
import { Worker } from "node:worker_threads";
import { RUNNING_COMPILED } from "./project-root";

/** `entryFile` is the thread's .ts source; compiled, its .js twin runs instead. */
export function startTypeScriptWorker(entryFile: string, workerData: unknown): Worker {
	// Not the whole inherited execArgv: the parent's own loader flags would register tsx a second
	// time. Only a CPU profile (the benchmark's BENCH_PROFILE_DIR) is passed on, so that it covers
	// the threads as well as the main one.
	const execArgv = process.execArgv.filter(flag => flag.startsWith("--cpu-prof"));
	if (RUNNING_COMPILED) return new Worker(entryFile.replace(/\.ts$/, ".js"), { workerData, execArgv });
	const bootstrap = `require("tsx/cjs/api").register(); require(${JSON.stringify(entryFile)});`;
	return new Worker(bootstrap, { eval: true, workerData, execArgv });
}
