// Fixed-window request budgets per key (a client address, or a principal), on
// rate-limiter-flexible's in-memory store. Each gateway process keeps its own counts.
import { RateLimiterMemory, RateLimiterRes } from "rate-limiter-flexible";
import { RateLimitedError } from "./errors";

export interface RateBudget {
	limit: number;
	remaining: number;
	/** Seconds until the window of this key starts afresh. */
	resetSeconds: number;
}

export type RateLimiter = (key: string) => Promise<RateBudget>;

/** Counts one request for `key`; rejects with RateLimitedError once the budget is spent. */
export function createRateLimiter(limit: number, windowSeconds: number): RateLimiter {
	const limiter = new RateLimiterMemory({ points: limit, duration: windowSeconds });
	const seconds = (ms: number) => Math.max(1, Math.ceil(ms / 1000));
	return async key => {
		try {
			const result = await limiter.consume(key);
			return { limit, remaining: result.remainingPoints, resetSeconds: seconds(result.msBeforeNext) };
		} catch (err) {
			if (err instanceof RateLimiterRes) throw new RateLimitedError(seconds(err.msBeforeNext));
			throw err;
		}
	};
}
