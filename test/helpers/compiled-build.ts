// The compiled service as the Docker image holds it: `npm run build` (tsc into dist/), then a
// directory laid out like the image's /app (dist/, web/dist, package.json) with no TypeScript
// source in it, so that anything still reaching for a .ts file (a worker thread, a migration)
// fails there instead of quietly going through tsx. It sits inside the repository so that
// node_modules is found by walking up, as in the image.
import { execFile } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { promisify } from "node:util";
import lockfile from "proper-lockfile";

export const REPO_ROOT = path.resolve(__dirname, "..", "..");
const DIST = path.join(REPO_ROOT, "dist");
const run = promisify(execFile);
/** Set by global-setup.ts: when this jest run started (ms since the epoch). */
const RUN_STARTED_VARIABLE = "TEST_RUN_STARTED_AT";

export function rememberRunStart(): void {
	process.env[RUN_STARTED_VARIABLE] = String(Date.now());
}

/**
 * Runs `npm run build` once per jest run: unless dist/ was built since the run started, by this
 * suite or another (outside jest's global setup, always). A lock on the repository root is held
 * while it checks and builds, one suite at a time: a build starts by removing dist/, which
 * another suite may be running `node dist/server.js` from.
 */
export async function ensureBuilt(): Promise<void> {
	// A holder that died leaves the lock stale once it stops refreshing it (30 s); the build runs
	// asynchronously, so that a living holder's event loop keeps refreshing it.
	const release = await lockfile.lock(REPO_ROOT, { lockfilePath: path.join(REPO_ROOT, "dist.build-lock"), stale: 30_000, retries: { retries: 600, minTimeout: 200, maxTimeout: 500 } });
	try {
		const built = fs.existsSync(path.join(DIST, "server.js")) ? fs.statSync(path.join(DIST, "server.js")).mtimeMs : 0;
		if (built > Number(process.env[RUN_STARTED_VARIABLE] ?? Infinity)) return;
		await run("npm", ["run", "build"], { cwd: REPO_ROOT, encoding: "utf8" }).catch((err: Error & { stdout?: string; stderr?: string }) => {
			throw new Error(`npm run build failed (${err.message}):\n${err.stdout}\n${err.stderr}`);
		});
	} finally {
		await release();
	}
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
