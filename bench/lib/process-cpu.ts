// CPU time of the machine's other processes, read from /proc: the PostgreSQL server and
// nats-server are shared by every scenario, so their CPU per delivery is read over a window by
// name (every postgres backend, the postmaster and its helpers). Linux only; elsewhere it reads 0.
import { execFileSync } from "node:child_process";
import fs from "node:fs";

let ticksPerSecond: number | undefined;
function clockTicks(): number {
	if (ticksPerSecond === undefined) {
		try {
			ticksPerSecond = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
		} catch {
			ticksPerSecond = 100;
		}
	}
	return ticksPerSecond;
}

/** CPU seconds (user + system) used so far by the live processes with one of these names. */
export function cpuSecondsOf(names: string[]): number {
	let ticks = 0;
	let entries: string[];
	try {
		entries = fs.readdirSync("/proc").filter(entry => /^\d+$/.test(entry));
	} catch {
		return 0;
	}
	for (const pid of entries) {
		let stat: string;
		try {
			stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
		} catch {
			continue; // gone meanwhile
		}
		// "pid (comm) state ppid …": comm may hold spaces and parentheses, so split at the last ")".
		const close = stat.lastIndexOf(")");
		const comm = stat.slice(stat.indexOf("(") + 1, close);
		if (!names.includes(comm)) continue;
		const fields = stat.slice(close + 2).split(" ");
		// After comm: state is field 3, utime field 14 and stime field 15 of the whole line.
		ticks += Number(fields[11]) + Number(fields[12]);
	}
	return ticks / clockTicks();
}

export const DATABASE_PROCESSES = ["postgres"];
export const BROKER_PROCESSES = ["nats-server"];
