// One role of a cluster (gateway, dispatcher, notifier…) as a real child process: the server
// with the role's environment, as an operator starts it, its output in a log file. It runs as
// node itself (on the run's transpiled copy, service-build.ts), not through npm or the tsx CLI,
// so that a signal reaches the server and SIGKILL really kills it.
import { setTimeout as sleep } from "node:timers/promises";
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import { tailOf } from "./nats-server";
import { serviceCommand } from "./service-build";
import { REPO_ROOT } from "./compiled-build";

export { REPO_ROOT };

export interface RoleExit {
	code: number | null;
	signal: NodeJS.Signals | null;
}

export class RoleProcess {
	private child: ChildProcess | undefined;
	private exitedPromise: Promise<RoleExit> = Promise.resolve({ code: null, signal: null });
	/** How many times this role was started (a restart appends to the same log). */
	starts = 0;

	constructor(
		readonly name: string,
		readonly env: Record<string, string>,
		readonly logFile: string,
	) {}

	get pid(): number | undefined {
		return this.child?.pid;
	}

	get running(): boolean {
		return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
	}

	get exited(): Promise<RoleExit> {
		return this.exitedPromise;
	}

	get opsUrl(): string {
		return `http://127.0.0.1:${this.env.OPS_PORT}`;
	}

	/** Starts the process (again, after a kill: same environment, ports and node id). */
	start(): void {
		if (this.running) throw new Error(`${this.name} is already running`);
		this.starts += 1;
		fs.appendFileSync(this.logFile, `\n===== ${new Date().toISOString()} start #${this.starts} of ${this.name} =====\n`);
		const log = fs.openSync(this.logFile, "a");
		const { command, args } = serviceCommand();
		const child = spawn(command, args, { cwd: REPO_ROOT, env: this.env, stdio: ["ignore", log, log] });
		fs.closeSync(log);
		this.child = child;
		this.exitedPromise = new Promise(resolve => child.once("exit", (code, signal) => resolve({ code, signal })));
	}

	/** Waits until /health on OPS_PORT answers 200; fails with the log's tail if the process dies. */
	async waitHealthy(boundMs = 90_000): Promise<void> {
		const giveUpAt = Date.now() + boundMs;
		let last = "no answer";
		while (Date.now() < giveUpAt) {
			if (!this.running) throw new Error(`${this.name} exited before it was healthy:\n${this.tail()}`);
			try {
				const response = await fetch(`${this.opsUrl}/health`);
				last = `${response.status} ${await response.text()}`;
				if (response.status === 200) return;
			} catch {
				// not listening yet
			}
			await sleep(100);
		}
		throw new Error(`${this.name} was not healthy within ${boundMs} ms (last: ${last}):\n${this.tail()}`);
	}

	/** /health as it answers now (status and body), or null when nothing answers. */
	async health(boundMs = 20_000): Promise<{ status: number; body: any } | null> {
		try {
			const response = await fetch(`${this.opsUrl}/health`, { signal: AbortSignal.timeout(boundMs) });
			return { status: response.status, body: await response.json() };
		} catch {
			return null;
		}
	}

	/** The sum of a Prometheus metric's samples on OPS_PORT /metrics (every label set), 0 if absent. */
	async metric(name: string): Promise<number> {
		const text = await fetch(`${this.opsUrl}/metrics`, { signal: AbortSignal.timeout(10_000) }).then(response => response.text());
		return text
			.split("\n")
			.filter(line => line.startsWith(`${name}{`) || line.startsWith(`${name} `))
			.reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(" ") + 1)), 0);
	}

	/** Freezes the process (SIGSTOP), as a stalled machine would: it holds what it has and does nothing. */
	freeze(): void {
		if (this.running) this.child!.kill("SIGSTOP");
	}

	/** Sends a signal and waits for the process to end. */
	async kill(signal: NodeJS.Signals = "SIGKILL"): Promise<RoleExit> {
		if (this.running) this.child!.kill(signal);
		return this.exitedPromise;
	}

	/**
	 * SIGTERM, then SIGKILL if the process is still there after `boundMs`. Returns how it ended
	 * and whether the bound was hit, so that a test can tell a clean stop from a hang.
	 */
	async terminate(boundMs = 40_000): Promise<RoleExit & { killedAfterBound: boolean }> {
		if (!this.running) return { ...(await this.exitedPromise), killedAfterBound: false };
		this.child!.kill("SIGTERM");
		let timer: NodeJS.Timeout | undefined;
		const bound = new Promise<"bound">(resolve => (timer = setTimeout(() => resolve("bound"), boundMs)));
		const outcome = await Promise.race([this.exitedPromise, bound]);
		clearTimeout(timer);
		if (outcome !== "bound") return { ...outcome, killedAfterBound: false };
		this.child!.kill("SIGKILL");
		return { ...(await this.exitedPromise), killedAfterBound: true };
	}

	tail(lines = 60): string {
		return `----- ${this.name} (${this.logFile}) -----\n${tailOf(this.logFile, lines)}`;
	}
}
