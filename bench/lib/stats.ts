// Small statistics helpers shared by the benchmark parts.

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

export function summarize(values: readonly number[]): Summary {
	const mean = values.reduce((sum, value) => sum + value, 0) / (values.length || 1);
	return {
		count: values.length,
		mean: round(mean),
		p50: round(percentile(values, 50)),
		p90: round(percentile(values, 90)),
		p99: round(percentile(values, 99)),
		max: round(values.reduce((max, value) => Math.max(max, value), Number.NEGATIVE_INFINITY)),
	};
}
