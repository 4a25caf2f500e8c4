// A command a developer runs in a terminal (`npm run listen`, an example), as a real child process
// in its own process group, with its output collected so that a test can wait for a line. Stop
// signals go to the whole group, as Ctrl-C in a terminal does: npm does not pass them on.
import { setTimeout as sleep } from "node:timers/promises";
import { spawn, type ChildProcess } from "node:child_process";
import { REPO_ROOT } from "./role-process";

export interface CommandExit {
	code: number | null;
	signal: NodeJS.Signals | null;
}

export class CommandProcess {
	output = "";
	readonly exited: Promise<CommandExit>;
	private readonly child: ChildProcess;

	constructor(command: string, args: string[], env: NodeJS.ProcessEnv, cwd = REPO_ROOT) {
		this.child = spawn(command, args, { cwd, env, detached: true, stdio: ["ignore", "pipe", "pipe"] });
		this.child.stdout!.on("data", chunk => (this.output += chunk));
		this.child.stderr!.on("data", chunk => (this.output += chunk));
		this.exited = new Promise(resolve => this.child.once("close", (code, signal) => resolve({ code, signal })));
	}

	get running(): boolean {
		return this.child.exitCode === null && this.child.signalCode === null;
	}

	/** Resolves with the first match of `pattern` in the output; fails with the output when the bound passes or the command ends first. */
	async waitForOutput(pattern: RegExp, boundMs = 60_000): Promise<RegExpMatchArray> {
		const giveUpAt = Date.now() + boundMs;
		for (;;) {
			const match = this.output.match(pattern);
			if (match) return match;
			if (!this.running) throw new Error(`the command ended before printing ${pattern}:\n${this.output}`);
			if (Date.now() > giveUpAt) throw new Error(`no ${pattern} within ${boundMs} ms:\n${this.output}`);
			await sleep(100);
		}
	}

	/** Sends `signal` to the command's process group and waits for it to end (SIGKILL after the bound). */
	async stop(signal: NodeJS.Signals = "SIGINT", boundMs = 20_000): Promise<CommandExit> {
		this.signalGroup(signal);
		const timer = setTimeout(() => this.signalGroup("SIGKILL"), boundMs);
		const exit = await this.exited;
		clearTimeout(timer);
		return exit;
	}

	private signalGroup(signal: NodeJS.Signals): void {
		try {
			process.kill(-this.child.pid!, signal);
		} catch (err) {
			if ((err as NodeJS.ErrnoException).code !== "ESRCH") throw err; // the group has ended
		}
	}
}

/**
 * The environment of `npm start` on a developer's machine with a fresh DATA_DIR: the embedded
 * default (none of the cluster's variables, generated secrets), on the given ports.
 */
export function developmentEnv(dataDir: string, port: number, opsPort: number): Record<string, string> {
	const inherited = Object.fromEntries(Object.entries(process.env).filter((entry): entry is [string, string] => entry[1] !== undefined));
	return {
		...inherited,
		DATA_DIR: dataDir,
		PORT: String(port),
		OPS_PORT: String(opsPort),
		HOST: "127.0.0.1",
		DATABASE_URL: "",
		TRANSPORTER: "",
		NODE_ENV: "",
		AUTH_JWT_SECRET: "",
		SECRETS_KEY: "",
		WEBHOOK_ALLOW_NETS: "",
		WEBHOOK_CA_FILE: "",
		LOG_LEVEL: "warn",
	};
}
