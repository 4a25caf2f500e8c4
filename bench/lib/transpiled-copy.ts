// A transpiled copy of the repository's TypeScript: the same esbuild transform tsx applies on the
// fly, written once into a directory one level below the repository root (as dist/ sits), a .js
// for each .ts in the same layout, so that node_modules is found by walking up and
// lib/project-root.ts finds web/dist. Processes started from it run as the Docker image runs the
// service, plain node on JavaScript, without tsx's loader: that loader costs about 0.7 s of CPU at
// each process's start and 0.2 s at each worker thread's, which lands on the first seconds a
// benchmark measures. The test suite makes one per run for the role processes it starts
// (test/helpers/service-build.ts); the benchmark makes one per run for its child processes
// (child.ts).
import fs from "node:fs";
import path from "node:path";
import { buildSync } from "esbuild";
import { PROJECT_ROOT } from "../../lib/project-root";

/**
 * Names a transpiled copy that already exists: the benchmark starts its children from it instead
 * of making one (child.ts), and the test suite sets it to its run's copy (global setup).
 */
export const TRANSPILED_COPY_VARIABLE = "BENCH_TRANSPILED_COPY";

/**
 * What the copy holds: the entry files and every module of these directories. That is what a
 * process of the service loads, and the benchmark with the test helpers it imports (and the crash
 * test's child, which runs the app without the server around it).
 */
const SOURCES = { files: ["server.ts", "app.ts", "moleculer.config.ts"], dirs: ["lib", "mixins", "services", "migrations", "bench", "test/helpers"] };

function typescriptFilesUnder(dir: string): string[] {
	return fs.readdirSync(dir, { recursive: true, encoding: "utf8" }).filter(file => file.endsWith(".ts") && !file.endsWith(".d.ts")).map(file => path.join(dir, file));
}

/** Transpiles SOURCES into a new directory `<root>/<prefix>XXXXXX` and returns its path. */
export function transpileRepository(prefix: string): string {
	const outdir = fs.mkdtempSync(path.join(PROJECT_ROOT, prefix));
	const entryPoints = [...SOURCES.files.map(file => path.join(PROJECT_ROOT, file)), ...SOURCES.dirs.flatMap(dir => typescriptFilesUnder(path.join(PROJECT_ROOT, dir)))];
	buildSync({ entryPoints, outdir, outbase: PROJECT_ROOT, bundle: false, format: "cjs", platform: "node", target: "node20", logLevel: "error" });
	// Modules import package.json (the version) relative to themselves, as tsc copies it into dist/.
	fs.copyFileSync(path.join(PROJECT_ROOT, "package.json"), path.join(outdir, "package.json"));
	return outdir;
}
