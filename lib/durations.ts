// Human-friendly durations ("500ms", "15s", "2h") used by configuration.
const UNIT_MS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/**
 * Parses "15s", "2h", "250ms" into milliseconds. The unit is required: a bare "5" once meant
 * 5 ms, which nobody who wrote WEBHOOK_TEST_TIMEOUT=5 ever meant.
 */
export function parseDuration(text: string): number {
	const match = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$/.exec(text);
	if (!match) {
		const hint = /^\s*\d+(?:\.\d+)?\s*$/.test(text) ? `"${text}" has no unit` : `"${text}" is not a duration`;
		throw new Error(`${hint} (use e.g. 500ms, 15s, 5m, 2h, 30d)`);
	}
	const millis = Number(match[1]) * UNIT_MS[match[2]];
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
