// The service's role processes in the suites run from a transpiled copy of the source, made once
// per jest run (global-setup.ts), not through tsx's loader in each process. It is the same
// esbuild transform of the same files that tsx applies on the fly, so the code is the code
// `npm start` runs; what it saves is tsx's cost at every start: its module hooks in the main
// thread and in each worker thread, about 1 s of CPU per process on the 2-core CI machine, where
// the suites start about a hundred of them. The copy sits one level below the repository root,
// as dist/ does, so that lib/project-root.ts finds web/dist, and node_modules is found by
// walking up.
// The suites that check how an operator starts the service (`npm start`, `node --import tsx
// server.ts`, `node dist/server.js`) still start it that way.
import fs from "node:fs";
import path from "node:path";
import { buildSync } from "esbuild";
import { REPO_ROOT } from "./compiled-build";

// What server.ts loads: the same set tsconfig.build.json compiles for the image, less the scripts;
// and the crash test's child, which runs the app without the server around it.
const ENTRY_FILES = ["server.ts", "app.ts", "moleculer.config.ts", "test/helpers/dispatcher-child.ts"];
const SOURCE_DIRS = ["lib", "mixins", "services", "migrations"];
/** Set by global-setup.ts for every worker: the directory holding the transpiled server.js. */
const BUILD_DIR_VARIABLE = "TEST_SERVICE_BUILD";

function typescriptFilesUnder(dir: string): string[] {
	return fs.readdirSync(dir, { recursive: true, encoding: "utf8" }).filter(file => file.endsWith(".ts") && !file.endsWith(".d.ts")).map(file => path.join(dir, file));
}

/** Transpiles the service into a new directory inside the repository and returns its path. */
export function buildServiceCopy(): string {
	const outdir = fs.mkdtempSync(path.join(REPO_ROOT, ".test-build-"));
	const entryPoints = [...ENTRY_FILES.map(file => path.join(REPO_ROOT, file)), ...SOURCE_DIRS.flatMap(dir => typescriptFilesUnder(path.join(REPO_ROOT, dir)))];
	buildSync({ entryPoints, outdir, outbase: REPO_ROOT, bundle: false, format: "cjs", platform: "node", target: "node20", logLevel: "error" });
	// Modules import package.json (the version) relative to themselves, as tsc copies it into dist/.
	fs.copyFileSync(path.join(REPO_ROOT, "package.json"), path.join(outdir, "package.json"));
	return outdir;
}

export function rememberServiceCopy(dir: string): void {
	process.env[BUILD_DIR_VARIABLE] = dir;
}

/** The run's transpiled copy, when jest's global setup made one. */
export function serviceCopyDir(): string | undefined {
	return process.env[BUILD_DIR_VARIABLE];
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
	const transpiled = dir && path.join(dir, entry.replace(/\.ts$/, ".js"));
	if (transpiled && fs.existsSync(transpiled)) return { command: process.execPath, args: [transpiled] };
	return { command: process.execPath, args: ["--import", "tsx", entry] };
}
