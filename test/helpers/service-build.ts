// The service's role processes in the suites run from a transpiled copy of the source, made once
// per jest run (global-setup.ts) by bench/lib/transpiled-copy.ts, not through tsx's loader in
// each process. It is the same esbuild transform of the same files that tsx applies on the fly,
// so the code is the code `npm start` runs; what it saves is tsx's cost at every start: its
// module hooks in the main thread and in each worker thread, about 1 s of CPU per process on the
// 2-core CI machine, where the suites start about a hundred of them. The benchmark's children,
// in the suites that run `npm run bench`, start from the same copy.
// The suites that check how an operator starts the service (`npm start`, `node --import tsx
// server.ts`, `node dist/server.js`) still start it that way.
import fs from "node:fs";
import path from "node:path";
import { TRANSPILED_COPY_VARIABLE, transpileRepository } from "../../bench/lib/transpiled-copy";
import { transpiledTwin } from "../../lib/project-root";
import { REPO_ROOT } from "./compiled-build";

/**
 * Transpiles the service into a new directory inside the repository and returns its path; it
 * holds the benchmark too, for the suites that run `npm run bench`.
 */
export function buildServiceCopy(): string {
	return transpileRepository(".test-build-");
}

export function rememberServiceCopy(dir: string): void {
	// Set by global-setup.ts for every worker, and read by the benchmark (bench/lib/child.ts) in the
	// suites that run it: its children start from this run's copy too.
	process.env[TRANSPILED_COPY_VARIABLE] = dir;
}

/** The run's transpiled copy, when jest's global setup made one. */
export function serviceCopyDir(): string | undefined {
	return process.env[TRANSPILED_COPY_VARIABLE];
}

export function removeServiceCopy(): void {
	const dir = serviceCopyDir();
	if (dir) fs.rmSync(dir, { recursive: true, force: true });
}

/**
 * How a suite starts the service (`entry`, a .ts file relative to the repository root, which is
 * the cwd) as a process: its twin in the transpiled copy when the run made one, else the source
 * through tsx (a suite run outside jest's global setup).
 */
export function serviceCommand(entry = "server.ts"): { command: string; args: string[] } {
	const dir = serviceCopyDir();
	const transpiled = dir && transpiledTwin(dir, path.join(REPO_ROOT, entry));
	if (transpiled && fs.existsSync(transpiled)) return { command: process.execPath, args: [transpiled] };
	return { command: process.execPath, args: ["--import", "tsx", entry] };
}
