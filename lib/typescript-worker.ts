// Worker threads whose code is TypeScript, loaded the way the service loads its own (tsx),
// whether the parent runs under tsx, ts-jest or plain node.
import { Worker } from "node:worker_threads";

export function startTypeScriptWorker(entryFile: string, workerData: unknown): Worker {
	const bootstrap = `require("tsx/cjs/api").register(); require(${JSON.stringify(entryFile)});`;
	// Not the whole inherited execArgv: the parent's own loader flags would register tsx a second
	// time. Only a CPU profile (the benchmark's BENCH_PROFILE_DIR) is passed on, so that it covers
	// the threads as well as the main one.
	const profiling = process.execArgv.filter(flag => flag.startsWith("--cpu-prof"));
	return new Worker(bootstrap, { eval: true, workerData, execArgv: profiling });
}
