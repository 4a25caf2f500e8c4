// Human-friendly durations ("500ms", "15s", "2h") used by configuration.
const UNIT_MS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** Parses "15s", "2h", "250ms" (or a bare number of milliseconds) into milliseconds. */
export function parseDuration(text: string): number {
	const match = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$/.exec(text);
	if (!match) throw new Error(`"${text}" is not a duration (use e.g. 500ms, 15s, 5m, 2h)`);
	const millis = Number(match[1]) * UNIT_MS[match[2] ?? "ms"];
	if (!Number.isFinite(millis)) throw new Error(`"${text}" is too large`);
	return Math.round(millis);
}

/** Parses a comma-separated list of durations, e.g. "1m,5m,30m,2h,6h". */
export function parseDurationList(text: string): number[] {
	return text
		.split(",")
		.map(part => part.trim())
		.filter(Boolean)
		.map(parseDuration);
}
