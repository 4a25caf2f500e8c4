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
// Held while a suite checks and builds dist/: a build starts by removing dist/, which another
// suite may be running `node dist/server.js` from.
const BUILD_LOCK = path.join(REPO_ROOT, "dist.build-lock");
const LOCK_WAIT_MS = 300_000;
/** Set by global-setup.ts: when this jest run started (ms since the epoch). */
const RUN_STARTED_VARIABLE = "TEST_RUN_STARTED_AT";

export function rememberRunStart(): void {
	process.env[RUN_STARTED_VARIABLE] = String(Date.now());
}

function sleepSync(ms: number): void {
	Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

function isAlive(pid: number): boolean {
	try {
		process.kill(pid, 0);
		return true;
	} catch {
		return false;
	}
}

function withBuildLock(work: () => void): void {
	const giveUpAt = Date.now() + LOCK_WAIT_MS;
	for (;;) {
		try {
			fs.mkdirSync(BUILD_LOCK);
			break;
		} catch (err) {
			if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
			// A lock whose holder is gone (a run killed mid-build) is taken over.
			const holder = Number(fs.readFileSync(path.join(BUILD_LOCK, "pid"), { encoding: "utf8", flag: "a+" }));
			if (holder && !isAlive(holder)) fs.rmSync(BUILD_LOCK, { recursive: true, force: true });
			else if (Date.now() > giveUpAt) throw new Error(`${BUILD_LOCK} was held for ${LOCK_WAIT_MS} ms`);
			else sleepSync(200);
		}
	}
	try {
		fs.writeFileSync(path.join(BUILD_LOCK, "pid"), String(process.pid));
		work();
	} finally {
		fs.rmSync(BUILD_LOCK, { recursive: true, force: true });
	}
}

/**
 * Runs `npm run build` once per jest run: unless dist/ was built since the run started, by this
 * suite or another (outside jest's global setup, always).
 */
export function ensureBuilt(): void {
	withBuildLock(() => {
		const built = fs.existsSync(path.join(DIST, "server.js")) ? fs.statSync(path.join(DIST, "server.js")).mtimeMs : 0;
		if (built > Number(process.env[RUN_STARTED_VARIABLE] ?? Infinity)) return;
		const result = spawnSync("npm", ["run", "build"], { cwd: REPO_ROOT, encoding: "utf8" });
		if (result.status !== 0) throw new Error(`npm run build failed (${result.status}):\n${result.stdout}\n${result.stderr}`);
	});
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
