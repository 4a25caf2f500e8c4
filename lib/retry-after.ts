// Receivers steer retries (Standard Webhooks, "Retry-After"): a 429, 502, 503 or 504 answer may
// say when to come back, as delay-seconds or an HTTP date (RFC 9110 §10.2.3). Pure functions:
// the sender reads the header, the dispatcher folds it into the persisted schedule.

/** The statuses whose Retry-After we honour; on other answers the header means nothing to us. */
export const RETRY_AFTER_STATUSES: ReadonlySet<number> = new Set([429, 502, 503, 504]);

/**
 * When the receiver asks to be retried, or null when the header is absent, malformed, or names
 * a moment already past. `now` is when the answer arrived.
 */
export function parseRetryAfter(value: string | string[] | undefined, now: Date): Date | null {
	const text = (Array.isArray(value) ? value[0] : value)?.trim();
	if (!text) return null;
	if (/^\d+$/.test(text)) {
		const seconds = Number(text);
		if (!Number.isSafeInteger(seconds) || seconds === 0) return null;
		// Anything past a year is as good as "never"; clamping later keeps it inside the window.
		return new Date(now.getTime() + Math.min(seconds, 366 * 86_400) * 1000);
	}
	// An HTTP date names a weekday and GMT; Date.parse alone would also take "2" or "tomorrow".
	if (!/^[A-Za-z]{3},? .+ GMT$/.test(text) && !/^[A-Za-z]+, \d{2}-[A-Za-z]{3}-\d{2} .+ GMT$/.test(text)) return null;
	const at = Date.parse(text);
	if (Number.isNaN(at) || at <= now.getTime()) return null;
	return new Date(at);
}

/**
 * The next attempt after a failure, honouring the receiver's Retry-After: no earlier than it
 * asks, but never past the end of the retry window (first attempt + last offset), so every
 * retry still falls within it. `scheduled` is what the persisted schedule chose.
 */
export function honourRetryAfter(scheduled: Date, retryAfter: Date | null, firstAttemptAt: Date, offsets: readonly number[]): Date {
	if (!retryAfter || retryAfter <= scheduled) return scheduled;
	const windowEnd = firstAttemptAt.getTime() + offsets[offsets.length - 1];
	if (retryAfter.getTime() <= windowEnd) return retryAfter;
	return new Date(Math.max(scheduled.getTime(), windowEnd));
}
