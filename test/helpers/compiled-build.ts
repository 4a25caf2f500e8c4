// The compiled service as the Docker image holds it: `npm run build` (tsc into dist/), then a
// directory laid out like the image's /app (dist/, web/dist, package.json) with no TypeScript
// source in it, so that anything still reaching for a .ts file (a worker thread, a migration)
// fails there instead of quietly going through tsx. It sits inside the repository so that
// node_modules is found by walking up, as in the image.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

export const REPO_ROOT = path.resolve(__dirname, "..", "..");
const DIST = path.join(REPO_ROOT, "dist");
const SOURCES = ["server.ts", "app.ts", "moleculer.config.ts", "package.json", "tsconfig.json", "tsconfig.build.json", "lib", "mixins", "services", "migrations", "scripts"];

function newestSourceChange(): number {
	let newest = 0;
	const visit = (file: string) => {
		const stat = fs.statSync(file);
		if (stat.isDirectory()) for (const entry of fs.readdirSync(file)) visit(path.join(file, entry));
		else newest = Math.max(newest, stat.mtimeMs);
	};
	for (const source of SOURCES) visit(path.join(REPO_ROOT, source));
	return newest;
}

/** Runs `npm run build` unless dist/ is newer than every source it is built from (or `force`). */
export function ensureBuilt(options: { force?: boolean } = {}): void {
	const built = fs.existsSync(path.join(DIST, "server.js")) ? fs.statSync(path.join(DIST, "server.js")).mtimeMs : 0;
	if (!options.force && built > newestSourceChange()) return;
	const result = spawnSync("npm", ["run", "build"], { cwd: REPO_ROOT, encoding: "utf8" });
	if (result.status !== 0) throw new Error(`npm run build failed (${result.status}):\n${result.stdout}\n${result.stderr}`);
}

export interface ImageLayout {
	/** The directory to run `node dist/server.js` in, like the image's WORKDIR. */
	dir: string;
	remove(): void;
}

/** dist/ and the built web app, as the Dockerfile copies them, and nothing else of the source. */
export function imageLayout(): ImageLayout {
	const dir = fs.mkdtempSync(path.join(REPO_ROOT, ".image-check-"));
	fs.cpSync(DIST, path.join(dir, "dist"), { recursive: true });
	fs.copyFileSync(path.join(REPO_ROOT, "package.json"), path.join(dir, "package.json"));
	fs.mkdirSync(path.join(dir, "web"));
	fs.cpSync(path.join(REPO_ROOT, "web", "dist"), path.join(dir, "web", "dist"), { recursive: true });
	return { dir, remove: () => fs.rmSync(dir, { recursive: true, force: true }) };
}
