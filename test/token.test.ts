// `npm run -s token`: prints one line, a JWT that a server on the same DATA_DIR accepts, with the
// claims asked for. Run through npm exactly as the README and docs/configuration.md tell users to (`-s` keeps npm's banner
// off standard output; .npmrc leaves npm's normal output on for everything else).
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { decodeJwt, jwtVerify } from "jose";
import { expectProblem, startStack, type Stack } from "./helpers/stack";
import { testDatabases } from "./helpers/services";

const ROOT = path.resolve(__dirname, "..");
const JWT = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/;

interface Run {
	code: number | null;
	stdout: string;
	stderr: string;
}

/** Runs `npm run -s token -- <args>` (or without `-s`) from a shell-like environment (no settings of an outer npm). */
function npmRunToken(args: string[], env: Record<string, string>, silent = true): Promise<Run> {
	const shellEnv = Object.fromEntries(Object.entries(process.env).filter(([name]) => !/^npm_/i.test(name)));
	return new Promise((resolve, reject) => {
		const child = spawn("npm", ["run", ...(silent ? ["-s"] : []), "token", "--", ...args], {
			cwd: ROOT,
			env: { ...shellEnv, AUTH_JWT_SECRET: "", AUTH_JWKS_URL: "", AUTH_ISSUER: "", AUTH_AUDIENCE: "", NODE_ENV: "", ...env },
		});
		let stdout = "";
		let stderr = "";
		child.stdout.on("data", chunk => (stdout += chunk));
		child.stderr.on("data", chunk => (stderr += chunk));
		child.on("error", reject);
		child.on("exit", code => resolve({ code, stdout, stderr }));
	});
}

describe.each(testDatabases())("npm run -s token (%s)", database => {
	let dataDir: string;
	let stack: Stack;
	let minted: Run;

	beforeAll(async () => {
		dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-token-"));
		// The command runs first, as on a fresh checkout: it generates the secrets the server then reuses.
		minted = await npmRunToken(["--sub", "alice", "--email", "a@x", "--customer", "acme", "--name", "Alice A"], { DATA_DIR: dataDir });
		stack = await startStack({ database, dataDir });
	});
	afterAll(async () => {
		await stack.stop();
		fs.rmSync(dataDir, { recursive: true, force: true });
	});

	it("prints exactly one line: the token", () => {
		expect(minted.code).toBe(0);
		expect(minted.stdout.endsWith("\n")).toBe(true);
		const lines = minted.stdout.split("\n").slice(0, -1);
		expect(lines).toHaveLength(1);
		expect(lines[0]).toMatch(JWT);
	});

	it("carries the claims asked for", () => {
		const claims = decodeJwt(minted.stdout.trim());
		expect(claims).toMatchObject({ sub: "alice", email: "a@x", name: "Alice A", customer_id: "acme" });
		expect(claims.exp! - claims.iat!).toBe(12 * 3600);
	});

	it("is accepted by a server on the same DATA_DIR, which records the user under the customer", async () => {
		const token = minted.stdout.trim();
		const details = await stack.request("GET", "/id/v3/user/details", { token });
		expect(details.status).toBe(200);
		expect(details.body).toMatchObject({ user_id: "alice", email: "a@x", name: "Alice A" });
		const record = await stack.app.broker.call("users.get", { userId: "alice" });
		expect(record).toMatchObject({ user_id: "alice", customer_id: "acme" });
	});

	it("is signed with the DATA_DIR's secret: another DATA_DIR's server refuses it", async () => {
		const other = await startStack({ database, services: ["api", "topics"] });
		try {
			expectProblem(await other.request("GET", "/id/v3/webhooks/events", { token: minted.stdout.trim() }), 401);
		} finally {
			await other.stop();
		}
	});
});

describe("npm run -s token (arguments and configuration)", () => {
	const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-token-"));
	afterAll(() => fs.rmSync(dataDir, { recursive: true, force: true }));

	it("without --sub, exits non-zero with usage on stderr and nothing on stdout", async () => {
		const run = await npmRunToken(["--email", "a@x"], { DATA_DIR: dataDir });
		expect(run.code).not.toBe(0);
		expect(run.stdout).toBe("");
		expect(run.stderr).toMatch(/usage: npm run -s token -- --sub <user id>/);
	});

	it("--scope sets the scope claim (repeatable): what the HTTP event intake asks for", async () => {
		const run = await npmRunToken(["--sub", "orders-service", "--scope", "events:publish", "--scope", "reports:read"], { DATA_DIR: dataDir });
		expect({ code: run.code, stderr: run.stderr }).toEqual({ code: 0, stderr: "" });
		const claims = decodeJwt(run.stdout.trim());
		expect(claims).toMatchObject({ sub: "orders-service", scope: "events:publish reports:read" });
		expect(decodeJwt((await npmRunToken(["--sub", "alice"], { DATA_DIR: dataDir })).stdout.trim())).not.toHaveProperty("scope");
	});

	it("refuses an unknown option", async () => {
		const run = await npmRunToken(["--sub", "alice", "--admin"], { DATA_DIR: dataDir });
		expect(run.code).not.toBe(0);
		expect(run.stdout).toBe("");
		expect(run.stderr).toMatch(/--admin/);
	});

	it("signs with AUTH_JWT_SECRET when it is set, as the server would verify", async () => {
		const secret = "k".repeat(48);
		const run = await npmRunToken(["--sub", "bob", "--expires", "5m"], { DATA_DIR: dataDir, AUTH_JWT_SECRET: secret });
		expect(run.code).toBe(0);
		const { payload, protectedHeader } = await jwtVerify(run.stdout.trim(), new TextEncoder().encode(secret), { algorithms: ["HS256"] });
		expect(protectedHeader.alg).toBe("HS256");
		expect(payload).toMatchObject({ sub: "bob" });
		expect(payload.exp! - payload.iat!).toBe(300);
		expect(payload).not.toHaveProperty("customer_id");
	});

	it("without -s, npm is not silenced: its banner goes to stdout (so .npmrc hides no failure)", async () => {
		const run = await npmRunToken(["--sub", "carol"], { DATA_DIR: dataDir }, false);
		expect(run.code).toBe(0);
		expect(run.stdout).toMatch(/^> satellite-webhooks@[^\n]* token$/m);
		expect(run.stdout.trim().split("\n").at(-1)).toMatch(JWT);
	});
});
