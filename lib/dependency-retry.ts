// Retrying work that failed only because a dependency (database, broker, another service)
// briefly went away: an emitted event has no one to redeliver it, so its consumer tries again.
import { isDependencyFailure } from "./errors";

export interface DependencyRetryOptions {
	/** Tries in all, the first included. */
	attempts: number;
	/** The wait after the n-th failure is delayMs × n. */
	delayMs: number;
	/** Checked before each wait: a stopping service gives up at once. */
	stopping: () => boolean;
}

/** Runs `work`, trying again after dependency failures; other errors and the last failure are thrown. */
export async function retryOnDependencyFailure<T>(work: () => Promise<T>, options: DependencyRetryOptions): Promise<T> {
	for (let attempt = 1; ; attempt += 1) {
		try {
			return await work();
		} catch (err) {
			if (!isDependencyFailure(err) || attempt >= options.attempts || options.stopping()) throw err;
			await new Promise(resolve => setTimeout(resolve, options.delayMs * attempt));
		}
	}
}
