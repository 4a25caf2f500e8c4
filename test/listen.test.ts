// `npm run listen` as a developer runs it, beside a real `npm start` server: it waits until the
// service may reach localhost, prints the one line to restart the service with, then prints each
// delivery verified or not, pauses its webhook on Ctrl-C and resumes it on the next run.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import https from "node:https";
import { Webhook } from "standardwebhooks";
import { freePort } from "./helpers/net";
import { RoleProcess } from "./helpers/role-process";
import { CommandProcess, developmentEnv } from "./helpers/command-process";
import { loadConfig } from "../lib/config";
import { mintToken } from "../lib/auth";

/** Posts a body signed with `secret` to the receiver, trusting `caPem` only; answers the status. */
function postSigned(url: string, caPem: string, body: string, secret: string): Promise<number> {
	const id = `msg_${Date.now()}`;
	const timestamp = new Date();
	const signature = new Webhook(secret).sign(id, timestamp, body);
	return new Promise((resolve, reject) => {
		const request = https.request(url, {
			method: "POST",
			ca: caPem,
			headers: { "content-type": "application/json", "webhook-id": id, "webhook-timestamp": String(Math.floor(timestamp.getTime() / 1000)), "webhook-signature": signature },
		});
		request.on("response", response => {
			response.resume();
			resolve(response.statusCode ?? 0);
		});
		request.on("error", reject);
		request.end(body);
	});
}

describe("npm run listen", () => {
	const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-listen-"));
	const processes: Array<RoleProcess | CommandProcess> = [];
	let env: Record<string, string>;
	let apiUrl: string;
	let listenPort: number;

	const startServer = async (extra: Record<string, string> = {}) => {
		const server = new RoleProcess("server", { ...env, ...extra }, path.join(dataDir, "server.log"));
		processes.push(server);
		server.start();
		await server.waitHealthy();
		return server;
	};
	const startListen = () => {
		const listen = new CommandProcess("npm", ["run", "-s", "listen", "--", "--port", String(listenPort)], env);
		processes.push(listen);
		return listen;
	};
	const aliceWebhooks = async () => {
		const token = await mintToken(loadConfig({ DATA_DIR: dataDir }).config, { sub: "alice" });
		const response = await fetch(`${apiUrl}/webhooks`, { headers: { authorization: `Bearer ${token}` } });
		return ((await response.json()) as { webhooks: Array<{ id: string; name: string; url: string; active: boolean }> }).webhooks;
	};

	beforeAll(async () => {
		const port = await freePort();
		env = developmentEnv(dataDir, port, await freePort());
		apiUrl = `http://127.0.0.1:${port}/id/v3`;
		listenPort = await freePort();
	});

	afterAll(async () => {
		for (const running of processes.reverse()) {
			if (running instanceof RoleProcess) await running.terminate();
			else await running.stop();
		}
		fs.rmSync(dataDir, { recursive: true, force: true });
	});

	it("gets a strict service to deliver to it with one restart, verifies each delivery, pauses on Ctrl-C and resumes", async () => {
		const strict = await startServer();
		const listen = startListen();

		// A service with the production defaults refuses a localhost webhook: listen says how to
		// restart it, and nothing is registered meanwhile.
		const [line, allowNets, caFile] = await listen.waitForOutput(/^WEBHOOK_ALLOW_NETS=(\S+) WEBHOOK_CA_FILE=(\S+) npm start$/m);
		expect(listen.output).toContain("it refuses localhost webhook URLs");
		expect(allowNets).toBe("127.0.0.1/32,::1/128");
		expect(caFile).toBe(path.join(dataDir, "listen", "ca.pem"));
		expect(fs.readFileSync(caFile, "utf8")).toContain("-----BEGIN CERTIFICATE-----");
		expect(fs.statSync(path.join(dataDir, "listen", "ca-key.pem")).mode & 0o077).toBe(0);
		expect(await aliceWebhooks()).toEqual([]);

		// The one step: the line it printed.
		await strict.terminate();
		const variables = Object.fromEntries(line.replace(/ npm start$/, "").split(" ").map(pair => pair.split("=") as [string, string]));
		await startServer(variables);

		await listen.waitForOutput(/The service reaches this receiver\./);
		expect(listen.output).toMatch(/Created webhook [0-9a-f-]{36} for tasking:order_status as alice/);
		expect(listen.output).toMatch(/Z {2}verified {2}webhook:test {2}msg_\S+\n\{\n {2}"webhook_id": "[0-9a-f-]{36}",/);
		const [webhook] = await aliceWebhooks();
		expect(webhook).toMatchObject({ name: `npm run listen (localhost:${listenPort})`, url: `https://localhost:${listenPort}/`, active: true });

		// A delivery signed with another secret is printed as not verified and answered 400.
		const caPem = fs.readFileSync(caFile, "utf8");
		const forged = JSON.stringify({ type: "tasking:order_status", timestamp: new Date().toISOString(), data: { order_id: "o-forged" } });
		expect(await postSigned(`https://localhost:${listenPort}/`, caPem, forged, `whsec_${Buffer.alloc(32, 7).toString("base64")}`)).toBe(400);
		await listen.waitForOutput(/NOT VERIFIED \(No matching signature found\) {2}tasking:order_status {2}msg_\d+\n\{"type":"tasking:order_status"/);

		// Ctrl-C (to the terminal's process group: npm ends on it, the script pauses its webhook).
		await listen.stop("SIGINT");
		expect(listen.output).toContain(`Paused webhook ${webhook.id}`);
		expect((await aliceWebhooks())[0]).toMatchObject({ id: webhook.id, active: false });

		// The next run keeps the CA (the running service trusts it), resumes the same webhook with a
		// new secret, and the service reaches it again.
		const caBefore = caPem;
		const again = startListen();
		await again.waitForOutput(/The service reaches this receiver\./);
		expect(again.output).toMatch(/^Using the local development CA /m);
		expect(again.output).toContain(`Resumed webhook ${webhook.id}`);
		expect(again.output).not.toContain("WEBHOOK_ALLOW_NETS=");
		expect(fs.readFileSync(caFile, "utf8")).toBe(caBefore);
		expect(await aliceWebhooks()).toEqual([expect.objectContaining({ id: webhook.id, active: true })]);
	}, 240_000);
});
