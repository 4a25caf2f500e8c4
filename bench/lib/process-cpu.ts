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

/** CPU seconds (user + system) used so far by each live process with one of these names, by process id. */
export function cpuSecondsByPid(names: string[]): Map<string, number> {
	const byPid = new Map<string, number>();
	let entries: string[];
	try {
		entries = fs.readdirSync("/proc").filter(entry => /^\d+$/.test(entry));
	} catch {
		return byPid;
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
		byPid.set(pid, (Number(fields[11]) + Number(fields[12])) / clockTicks());
	}
	return byPid;
}

/**
 * CPU seconds these processes used between two readings of cpuSecondsByPid. A process that exited
 * meanwhile is left out rather than subtracted (on a shared server, other sessions' backends come
 * and go); one that started meanwhile counts whole.
 */
export function cpuSecondsBetween(before: Map<string, number>, after: Map<string, number>): number {
	let seconds = 0;
	for (const [pid, used] of after) seconds += Math.max(0, used - (before.get(pid) ?? 0));
	return seconds;
}

export const DATABASE_PROCESSES = ["postgres"];
export const BROKER_PROCESSES = ["nats-server"];
