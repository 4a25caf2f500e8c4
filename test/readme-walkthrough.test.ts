// The README's five-minute walk-through, run as written: every `sh` block of that section, in one
// bash session, against a real server started the way `npm start` starts it. Only the address
// changes (a free port instead of :3000) and DATA_DIR points at a fresh folder, so that the
// token command reads the secret this server generated.
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { freePort } from "./helpers/net";
import { waitUntil } from "./helpers/delivery-stack";
import { loadConfig } from "../lib/config";
import { mintToken } from "../lib/auth";

const ROOT = path.resolve(__dirname, "..");

function walkthroughScript(): string {
	const readme = fs.readFileSync(path.join(ROOT, "README.md"), "utf8");
	const section = readme.split(/^## /m).find(part => part.startsWith("Five-minute walk-through\n"));
	if (!section) throw new Error("the README has no Five-minute walk-through section");
	const blocks = [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map(match => match[1]);
	expect(blocks.length).toBeGreaterThanOrEqual(8);
	return blocks.join("\n");
}

function run(command: string, args: string[], env: NodeJS.ProcessEnv): { done: Promise<{ code: number | null; stdout: string; stderr: string }>; kill(): void } {
	const child = spawn(command, args, { cwd: ROOT, env });
	let stdout = "";
	let stderr = "";
	child.stdout.on("data", chunk => (stdout += chunk));
	child.stderr.on("data", chunk => (stderr += chunk));
	return {
		done: new Promise(resolve => child.on("close", code => resolve({ code, stdout, stderr }))),
		kill: () => child.kill("SIGTERM"),
	};
}

describe("the README's five-minute walk-through", () => {
	const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-walkthrough-"));
	let server: ReturnType<typeof run> | undefined;
	let port = 0;

	beforeAll(async () => {
		port = await freePort();
		const opsPort = await freePort();
		const env = { ...process.env, DATA_DIR: dataDir, PORT: String(port), OPS_PORT: String(opsPort), HOST: "127.0.0.1", DATABASE_URL: "", TRANSPORTER: "", NODE_ENV: "", AUTH_JWT_SECRET: "", SECRETS_KEY: "" };
		server = run("node", ["--import", "tsx", "server.ts"], env);
		await waitUntil(
			() => fetch(`http://127.0.0.1:${opsPort}/health`).then(response => response.status, () => 0),
			status => status === 200,
			"the server to start",
			60_000,
		);
	}, 90_000);

	afterAll(async () => {
		server?.kill();
		await server?.done;
		fs.rmSync(dataDir, { recursive: true, force: true });
	});

	it("runs every command as written and gets the answers it shows, touching only the webhook it created", async () => {
		// A user with an older webhook: the steps after create must act on the new one only.
		const token = await mintToken(loadConfig({ DATA_DIR: dataDir }).config, { sub: "alice" });
		const older = await fetch(`http://127.0.0.1:${port}/id/v3/webhooks`, {
			method: "POST",
			headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
			body: JSON.stringify({ name: "Older hook", url: "https://older.example.com/hook", events: ["tasking:order_status"] }),
		}).then(response => response.json() as Promise<{ id: string }>);

		const script = walkthroughScript().replaceAll("http://localhost:3000", `http://127.0.0.1:${port}`);
		const { code, stdout, stderr } = await run("bash", ["-euo", "pipefail", "-c", script], { ...process.env, DATA_DIR: dataDir }).done;
		expect({ code, stderr: stderr.split("\n").filter(line => line && !/npm warn/.test(line)) }).toEqual({ code: 0, stderr: [] });

		// The topics, the created webhook with its secret shown once, the rename and pause, the
		// rotation, the failed test (the example host does not resolve here), email on, the 204.
		expect(stdout).toContain('{"topic":"tasking:order_status","name":"Tasking order status updates"');
		expect(stdout).toMatch(/"name":"Orders to ERP","url":"https:\/\/hooks\.example\.com\/satellite".*"secret":"whsec_/);
		expect(stdout).toMatch(/"name":"Orders to ERP \(paused\)".*"active":false,"disabled_reason":"user"/);
		expect((stdout.match(/"secret":"whsec_[^"]+"/g) ?? []).length).toBe(2);
		expect(stdout).toMatch(/"success":false,"status_code":null/);
		expect(stdout).toMatch(/"settings":\[\{"topic":"tasking:order_status","name":"[^"]+","description":"[^"]+","email":true\}\]/);
		// The last command prints only the status code of the DELETE.
		expect(stdout.trimEnd()).toMatch(/\}204$/);
		const left = await fetch(`http://127.0.0.1:${port}/id/v3/webhooks`, { headers: { authorization: `Bearer ${token}` } }).then(response => response.json() as Promise<{ webhooks: unknown[] }>);
		expect(left.webhooks).toEqual([expect.objectContaining({ id: older.id, name: "Older hook", active: true })]);
	}, 120_000);
});
