// Small statistics helpers shared by the benchmark parts.
import os from "node:os";

/** The p-th percentile (0..100) of `values`, by the nearest-rank method. */
export function percentile(values: readonly number[], p: number): number {
	if (values.length === 0) return Number.NaN;
	const sorted = [...values].sort((a, b) => a - b);
	const rank = Math.ceil((p / 100) * sorted.length);
	return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1];
}

/** Rounds for JSON output: figures are noisy beyond a few significant digits anyway. */
export function round(value: number, digits = 2): number {
	const factor = 10 ** digits;
	return Math.round(value * factor) / factor;
}

export interface Summary {
	count: number;
	mean: number;
	p50: number;
	p90: number;
	p99: number;
	max: number;
}

/** The arithmetic mean; 0 for no values. */
export function mean(values: readonly number[]): number {
	return values.reduce((sum, value) => sum + value, 0) / (values.length || 1);
}

export function summarize(values: readonly number[]): Summary {
	return {
		count: values.length,
		mean: round(mean(values)),
		p50: round(percentile(values, 50)),
		p90: round(percentile(values, 90)),
		p99: round(percentile(values, 99)),
		max: round(values.reduce((max, value) => Math.max(max, value), Number.NEGATIVE_INFINITY)),
	};
}

/** A reading of the whole machine's CPU time (every process, every core), to compare with a later one. */
export interface MachineReading {
	busyMs: number;
	atMs: number;
}

export function readMachine(): MachineReading {
	const busyMs = os.cpus().reduce((sum, { times }) => sum + times.user + times.nice + times.sys + times.irq, 0);
	return { busyMs, atMs: performance.now() };
}

/** Cores the machine kept busy between two readings: at the core count, nothing was left for anyone. */
export function machineCoresBetween(from: MachineReading, to: MachineReading): number {
	return round((to.busyMs - from.busyMs) / (to.atMs - from.atMs));
}

/** The most of `times` (epoch or monotonic ms) within any one second: a half-open window starting at one of them. */
export function busiestSecond(times: readonly number[]): number {
	const sorted = [...times].sort((a, b) => a - b);
	let most = 0;
	for (let start = 0, end = 0; start < sorted.length; start += 1) {
		while (end < sorted.length && sorted[end] < sorted[start] + 1_000) end += 1;
		most = Math.max(most, end - start);
	}
	return most;
}

/** `value` ÷ `reference`, to two decimals. */
export function ratioOf(value: number, reference: number): number {
	return round(value / reference, 2);
}

/** The same, or null when either figure is unknown (a lost run) or the reference is 0. */
export function ratioOrNull(value: number | null, reference: number | null): number | null {
	return value === null || reference === null || reference === 0 ? null : ratioOf(value, reference);
}
