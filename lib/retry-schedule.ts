// The retry schedule of webhook deliveries (API.md, "Delivery"): retries come at fixed offsets
// from the FIRST attempt (default 1m, 5m, 30m, 2h, 6h), so all of them fall within the last
// offset. Jitter spreads retries of many deliveries that failed together, and it only ever moves
// a retry earlier: never past its nominal time, never before the previous offset.
// Pure functions: the dispatcher persists what they return.

/** Share of the gap to the previous offset that jitter may take off a retry's nominal time. */
export const DEFAULT_JITTER_FRACTION = 0.1;

export interface NextAttemptInput {
	/** When the first attempt of this delivery started. */
	firstAttemptAt: Date;
	/** Attempts made so far, the failed one included (1 after the first attempt). */
	attemptsMade: number;
	/** Retry offsets from the first attempt, in milliseconds, increasing. */
	offsets: readonly number[];
	now: Date;
	/** A number in [0, 1); Math.random by default, fixed in tests. */
	random?: () => number;
	jitterFraction?: number;
}

/** How many attempts a delivery gets in all: the first one plus one per offset. */
export function maxAttempts(offsets: readonly number[]): number {
	return offsets.length + 1;
}

/**
 * When to try again after a failed attempt, or null when the schedule is used up (the delivery
 * is then failed).
 *
 * Normally that is `firstAttemptAt + offsets[n]` minus the jitter. When that moment has already
 * passed (the attempt itself took long, the webhook was disabled for a while, or the service was
 * down), the retry keeps the schedule's spacing from now instead of firing at once, so a receiver
 * that just came back is not hit by every remaining retry in a burst.
 */
export function scheduleNextAttempt(input: NextAttemptInput): Date | null {
	const { firstAttemptAt, attemptsMade, offsets, now } = input;
	const random = input.random ?? Math.random;
	const jitterFraction = input.jitterFraction ?? DEFAULT_JITTER_FRACTION;
	const retryIndex = attemptsMade - 1;
	if (retryIndex < 0) throw new Error("attemptsMade must be at least 1");
	if (retryIndex >= offsets.length) return null;

	const offset = offsets[retryIndex];
	const previousOffset = retryIndex === 0 ? 0 : offsets[retryIndex - 1];
	const gap = offset - previousOffset;
	const jitter = Math.floor(clampUnit(random()) * jitterFraction * gap);

	const nominal = firstAttemptAt.getTime() + offset - jitter;
	if (nominal >= now.getTime()) return new Date(nominal);
	return new Date(now.getTime() + gap - jitter);
}

function clampUnit(value: number): number {
	if (!Number.isFinite(value) || value < 0) return 0;
	return value >= 1 ? 0.999_999 : value;
}
