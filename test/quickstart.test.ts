// The README's quick start, run as written in a fresh clone of this repository: each `sh` block in its
// own terminal-like process, the service through `npm start`, the receiver through
// `npm run listen`, stopped with Ctrl-C (SIGINT to the process group) as a person would.
// Two changes only: `npm install` is left out (the clone uses this checkout's node_modules and
// built web app: installing compiles better-sqlite3 and takes minutes), and the service listens
// on loopback on free ports instead of 3000/3030, so that it can run beside anything else here.
import { setTimeout as sleep } from "node:timers/promises";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { CommandProcess } from "./helpers/command-process";
import { REPO_ROOT } from "./helpers/role-process";
import { freePort } from "./helpers/net";

interface QuickStart {
	start: string;
	listen: string;
	restart: string;
	publish: string;
	mail: string;
}

function quickStartSteps(): QuickStart {
	const readme = fs.readFileSync(path.join(REPO_ROOT, "README.md"), "utf8");
	const section = readme.split(/^## /m).find(part => part.startsWith("Quick start\n"));
	if (!section) throw new Error("the README has no Quick start section");
	const blocks = [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map(match => match[1].trim());
	expect(blocks).toHaveLength(5);
	const [start, listen, restart, publish, mail] = blocks;
	return { start, listen, restart, publish, mail };
}

/** The command lines a reader types: neither comments nor continuations of a line. */
function commandLines(steps: QuickStart): number {
	return Object.values(steps)
		.flatMap(block => block.replace(/\\\n/g, " ").split("\n"))
		.filter(line => line.trim() && !line.trim().startsWith("#")).length;
}

describe("the README's quick start", () => {
	const steps = quickStartSteps();
	const clone = fs.mkdtempSync(path.join(os.tmpdir(), "swh-quickstart-"));
	const running: CommandProcess[] = [];
	let env: NodeJS.ProcessEnv;
	let opsPort = 0;
	let apiPort = 0;
	let listen: CommandProcess;

	/** A block as a terminal runs it, with the service's address moved to the free port. */
	const terminal = (block: string) => {
		const command = new CommandProcess("bash", ["-c", block.replaceAll("localhost:3000", `localhost:${apiPort}`)], env, clone);
		running.push(command);
		return command;
	};
	const healthy = async () => {
		for (let tries = 0; tries < 600; tries++) {
			const status = await fetch(`http://127.0.0.1:${opsPort}/health`).then(response => response.status, () => 0);
			if (status === 200) return;
			await sleep(100);
		}
		throw new Error("the service did not become healthy within 60 s");
	};

	beforeAll(async () => {
		execFileSync("git", ["clone", "--quiet", REPO_ROOT, clone]);
		fs.symlinkSync(path.join(REPO_ROOT, "node_modules"), path.join(clone, "node_modules"));
		fs.symlinkSync(path.join(REPO_ROOT, "web", "dist"), path.join(clone, "web", "dist"));
		apiPort = await freePort();
		opsPort = await freePort();
		// A developer's shell: none of the service's settings; the ports moved, and loopback only.
		env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !/^(DATA_DIR|DATABASE_URL|TRANSPORTER|NODE_ENV|AUTH_JWT_SECRET|SECRETS_KEY|WEBHOOK_|SMTP_URL|HOST$|PORT$|OPS_PORT$|NAMESPACE$)/.test(name)));
		env.PORT = String(apiPort);
		env.OPS_PORT = String(opsPort);
		env.HOST = "127.0.0.1";
	});

	afterAll(async () => {
		for (const command of running.reverse()) await command.stop("SIGINT");
		fs.rmSync(clone, { recursive: true, force: true });
	});

	it("takes at most six commands", () => {
		expect(steps.start).toBe("npm install && npm start");
		expect(commandLines(steps)).toBeLessThanOrEqual(6);
	});

	it("restarts the service with the line the SSRF policy of docs/delivery.md shows, so that the test below runs that one too", () => {
		const doc = fs.readFileSync(path.join(REPO_ROOT, "docs", "delivery.md"), "utf8");
		expect(doc).toContain("```sh\n" + steps.restart + "\n```");
	});

	it("steps 1 to 3: the service, the receiver, and the one restart it prints end in a verified test delivery", async () => {
		const start = terminal(steps.start.replace(/^npm install && /, ""));
		await healthy();

		listen = terminal(steps.listen);
		const [printed] = await listen.waitForOutput(/^WEBHOOK_ALLOW_NETS=\S+ WEBHOOK_CA_FILE=\S+ npm start$/m, 120_000);
		// What the receiver prints is what the quick start tells the reader to type.
		expect(printed).toBe(steps.restart);

		await start.stop("SIGINT");
		terminal(steps.restart);
		await healthy();
		await listen.waitForOutput(/The service reaches this receiver\./, 120_000);
		expect(listen.output).toMatch(/Z {2}verified {2}webhook:test {2}msg_/);
		expect(fs.readFileSync(path.join(clone, "data", "listen", "ca.pem"), "utf8")).toContain("-----BEGIN CERTIFICATE-----");
	}, 300_000);

	it("steps 4 to 6: an order event posted over HTTP prints as a verified delivery and leaves an email in data/mail", async () => {
		const publish = terminal(steps.publish);
		expect(await publish.exited).toEqual({ code: 0, signal: null });
		expect(publish.output).toMatch(/^\{"event_ids":\["[0-9a-f-]{36}"\]\}$/m);

		await listen.waitForOutput(/Z {2}verified {2}tasking:order_status {2}msg_\S+\n\{\n {2}"order_id": "o-1",\n {2}"status": "fulfilled"/, 60_000);

		// Each `ls` is read once it has ended: read as soon as it started, its output was always
		// still empty, and the loop ran all its tries (33 s) before the last one was read.
		let mail = terminal(steps.mail);
		await mail.exited;
		for (let tries = 0; tries < 300 && !/\.eml$/m.test(mail.output); tries++) {
			await sleep(100);
			mail = terminal(steps.mail);
			await mail.exited;
		}
		const [file] = mail.output.match(/^\S+\.eml$/m) ?? [];
		expect(file).toBeDefined();
		const email = fs.readFileSync(path.join(clone, "data", "mail", file!), "utf8");
		expect(email).toContain("alice@example.com");
		expect(email).toContain("Harbour survey");
	}, 120_000);
});
