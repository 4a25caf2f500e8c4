// For benchmark children: event-loop delay (perf_hooks.monitorEventLoopDelay, 1 ms resolution)
// and CPU time, read and reset by the parent over IPC ("probe" → {type: "probe", ...}), so that
// each phase of a run (first seconds, steady state) gets figures of its own. A service node adds
// its sender threads' figures, read from its own metrics.
// The delay monitor is a timer every millisecond, which costs the process it measures: a mostly
// idle one wakes a thousand times a second for it. So a window that measures CPU alone (a burst's,
// the floor's) is opened with "probe:cpu", and the monitor stays off until the next "probe".
import { monitorEventLoopDelay } from "node:perf_hooks";

export interface ProbeFigures {
	type: "probe";
	/** Event-loop delay in ms. */
	delay_p50_ms: number;
	delay_p99_ms: number;
	delay_max_ms: number;
	/** CPU time used (user + system) per second of wall time since the last reset: 1 = one core. */
	cpu_cores: number;
	/** A dispatcher's sender threads (from its metrics): the worst thread's delay p99, the busiest one's utilisation. */
	sender_delay_p99_ms?: number;
	sender_utilization?: number;
	/** A dispatcher's claims of due rows since it started (from its metrics): how many, and their seconds in all. */
	claims_due?: number;
	claims_due_seconds?: number;
	/** …and its claims of one webhook's rows (refills, probes) since it started. */
	claims_of_webhook?: number;
}

/** What the parent sends: read this window's figures, and open the next one watching the event loop, or measuring CPU only. */
export const PROBE_MESSAGES = { loop: "probe", cpu: "probe:cpu" } as const;
export type ProbeWindow = keyof typeof PROBE_MESSAGES;

export type SenderLoopReader = () => Promise<Pick<ProbeFigures, "sender_delay_p99_ms" | "sender_utilization" | "claims_due" | "claims_due_seconds" | "claims_of_webhook">>;

export function startEventLoopProbe(readSenderLoop?: SenderLoopReader): void {
	const histogram = monitorEventLoopDelay({ resolution: 1 });
	histogram.enable();
	let cpu = process.cpuUsage();
	let since = process.hrtime.bigint();
	const ms = (ns: number) => Math.round(ns / 1e4) / 100;
	process.on("message", async (message: unknown) => {
		if (message !== PROBE_MESSAGES.loop && message !== PROBE_MESSAGES.cpu) return;
		const sender = (await readSenderLoop?.()) ?? {};
		const used = process.cpuUsage(cpu);
		const wallUs = Number(process.hrtime.bigint() - since) / 1e3;
		process.send?.({
			type: "probe",
			delay_p50_ms: ms(histogram.percentile(50)),
			delay_p99_ms: ms(histogram.percentile(99)),
			delay_max_ms: ms(histogram.max),
			cpu_cores: Math.round(((used.user + used.system) / wallUs) * 100) / 100,
			...sender,
		} satisfies ProbeFigures);
		histogram.reset();
		if (message === PROBE_MESSAGES.loop) histogram.enable();
		else histogram.disable();
		cpu = process.cpuUsage();
		since = process.hrtime.bigint();
	});
}
