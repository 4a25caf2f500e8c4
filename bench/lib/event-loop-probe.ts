// For benchmark children: event-loop delay (perf_hooks.monitorEventLoopDelay, 1 ms resolution)
// and CPU time, read and reset by the parent over IPC ("probe" → {type: "probe", ...}), so that
// each phase of a run (first seconds, steady state) gets figures of its own.
import { monitorEventLoopDelay } from "node:perf_hooks";

export interface ProbeFigures {
	type: "probe";
	/** Event-loop delay in ms. */
	delay_p50_ms: number;
	delay_p99_ms: number;
	delay_max_ms: number;
	/** CPU time used (user + system) per second of wall time since the last reset: 1 = one core. */
	cpu_cores: number;
}

export function startEventLoopProbe(): void {
	const histogram = monitorEventLoopDelay({ resolution: 1 });
	histogram.enable();
	let cpu = process.cpuUsage();
	let since = process.hrtime.bigint();
	const ms = (ns: number) => Math.round(ns / 1e4) / 100;
	process.on("message", (message: unknown) => {
		if (message !== "probe") return;
		const used = process.cpuUsage(cpu);
		const wallUs = Number(process.hrtime.bigint() - since) / 1e3;
		process.send?.({
			type: "probe",
			delay_p50_ms: ms(histogram.percentile(50)),
			delay_p99_ms: ms(histogram.percentile(99)),
			delay_max_ms: ms(histogram.max),
			cpu_cores: Math.round(((used.user + used.system) / wallUs) * 100) / 100,
		} satisfies ProbeFigures);
		histogram.reset();
		cpu = process.cpuUsage();
		since = process.hrtime.bigint();
	});
}
