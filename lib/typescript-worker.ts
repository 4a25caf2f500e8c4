// Worker threads whose code is TypeScript, loaded the way the service loads its own (tsx),
// whether the parent runs under tsx, ts-jest or plain node.
import { Worker } from "node:worker_threads";

export function startTypeScriptWorker(entryFile: string, workerData: unknown): Worker {
	const bootstrap = `require("tsx/cjs/api").register(); require(${JSON.stringify(entryFile)});`;
	// No inherited execArgv: the parent's own loader flags would register tsx a second time.
	return new Worker(bootstrap, { eval: true, workerData, execArgv: [] });
}
