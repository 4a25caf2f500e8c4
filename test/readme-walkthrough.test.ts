// The documented shell commands that need only a running service, run as written against a real
// server started the way `npm start` starts it: every `sh` block of docs/walkthrough.md in one bash
// session, then the API reference's (docs/api.md) and the operator guide's (docs/operations.md)
// examples. Only the addresses change (free ports instead of :3000 and :3030) and DATA_DIR points
// at a fresh folder, so that the token command reads the secret this server generated.
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { freePort } from "./helpers/net";
import { waitUntil } from "./helpers/delivery-stack";
import { loadConfig } from "../lib/config";
import { mintToken } from "../lib/auth";
import { deriveUnsubscribeKey, signUnsubscribeToken } from "../lib/unsubscribe-token";

const ROOT = path.resolve(__dirname, "..");

/** The `sh` blocks of one file under docs/, in order. */
function shBlocks(file: string): string[] {
	const doc = fs.readFileSync(path.join(ROOT, "docs", file), "utf8");
	return [...doc.matchAll(/```sh\n([\s\S]*?)```/g)].map(match => match[1]);
}

function walkthroughScript(): string {
	const blocks = shBlocks("walkthrough.md");
	expect(blocks.length).toBeGreaterThanOrEqual(8);
	return blocks.join("\n");
}

/** The keys of the create answer the walk-through shows in its comment, in order. */
function sampleCreateAnswerKeys(): string[] {
	const block = shBlocks("walkthrough.md").find(code => code.startsWith("CREATED=$("));
	if (!block) throw new Error("docs/walkthrough.md has no create step");
	const sample = block
		.split("\n")
		.filter(line => line.startsWith("#"))
		.join("");
	return [...sample.matchAll(/"([a-z_]+)":/g)].map(match => match[1]);
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

describe("the documented commands against a running service", () => {
	const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-walkthrough-"));
	let server: ReturnType<typeof run> | undefined;
	let port = 0;
	let opsPort = 0;

	beforeAll(async () => {
		port = await freePort();
		opsPort = await freePort();
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

	it("docs/walkthrough.md: runs every command as written and gets the answers it shows, touching only the webhook it created", async () => {
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
		// The sample answer shows exactly the fields of the real one, in the same order.
		const created = JSON.parse(/\{"id":"[^\n]*?"secret":"whsec_[^"]+"\}/.exec(stdout)![0]) as Record<string, unknown>;
		expect(sampleCreateAnswerKeys()).toEqual(Object.keys(created));
	}, 120_000);

	it("docs/api.md and docs/operations.md: every example runs as written against a webhook with a delivery", async () => {
		const api = `http://127.0.0.1:${port}/id/v3`;
		const { config } = loadConfig({ DATA_DIR: dataDir });
		const token = await mintToken(config, { sub: "bob", email: "bob@example.com" });
		const call = (method: string, route: string, body?: unknown, bearer = token) =>
			fetch(`${api}${route}`, { method, headers: { authorization: `Bearer ${bearer}`, "content-type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) }).then(
				async response => ({ status: response.status, body: (await response.json()) as Record<string, unknown> }),
			);
		const webhook = await call("POST", "/webhooks", { name: "Reference examples", url: "https://hooks.example.com/reference", events: ["tasking:order_status"] });
		expect(webhook.status).toBe(201);
		const id = String(webhook.body.id);
		// One delivery in its log: an order event for bob, over the HTTP intake.
		const publisher = await mintToken(config, { sub: "orders-service", scope: "events:publish" });
		expect((await call("POST", "/events/tasking.order_status", { user_id: "bob", order_id: "o-ref", status: "fulfilled" }, publisher)).status).toBe(202);
		const deliveries = await waitUntil(
			() => call("GET", `/webhooks/${id}/deliveries`).then(answer => answer.body.deliveries as Array<{ id: string }>),
			found => found.length === 1,
			"the delivery to show in the log",
		);
		const unsubscribeToken = await signUnsubscribeToken({ userId: "bob", topic: "tasking:order_status" }, deriveUnsubscribeKey(config.SECRETS_KEY!), 60_000);

		const script = [...shBlocks("api.md"), ...shBlocks("operations.md").filter(block => !block.includes("npm run repl"))]
			.join("\n")
			.replaceAll("http://localhost:3000", `http://127.0.0.1:${port}`)
			.replaceAll("localhost:3030", `127.0.0.1:${opsPort}`);
		const variables = { TOKEN: token, API: api, ID: id, DELIVERY_ID: deliveries[0].id, UNSUB_TOKEN: unsubscribeToken };
		const { code, stdout, stderr } = await run("bash", ["-euo", "pipefail", "-c", script], { ...process.env, DATA_DIR: dataDir, ...variables }).done;
		expect({ code, stderr }).toEqual({ code: 0, stderr: "" });

		// No example answered a problem, and each printed what the docs say it does.
		expect(stdout).not.toMatch(/"type":"[^"]*","title":"[^"]*","status":[45]\d\d/);
		expect(stdout).toContain(`"id":"${deliveries[0].id}"`); // the delivery with its payload and attempts
		expect(stdout).toMatch(/"attempts_succeeded": \d+/); // the stats' totals, as jq prints them
		expect(stdout).toMatch(/\{"scheduled":\d+,"remaining":0\}/); // recover
		expect(stdout).toContain('"/id/v3/webhooks"'); // the OpenAPI document's paths
		expect(stdout).toMatch(/"status":"ok"/); // /health
		expect(stdout).toMatch(/^webhook_deliveries_pending \d+$/m); // /metrics
		expect(stdout).toContain("You are unsubscribed"); // the one-click unsubscribe
		// Email on, then off with If-Match (and the unsubscribe leaves it off).
		const details = await call("GET", "/user/details");
		const settings = (details.body.user_metadata as { notifications: Array<{ settings: Array<{ topic: string; email: boolean }> }> }).notifications.flatMap(category => category.settings);
		expect(settings.find(setting => setting.topic === "tasking:order_status")?.email).toBe(false);
		expect(stdout).toMatch(/"email":false/);
	}, 120_000);
});
