// A circuit breaker per webhook endpoint, as one dispatcher instance sees it. An endpoint that
// fails every attempt would otherwise be attempted as fast as its due retries come up: with a
// pile of due retries that is a request, a result write and an attempt row every millisecond,
// taken from the healthy endpoints sharing the event loop and the database writer (the bad-
// neighbour benchmark measured about a thousand such attempts a second).
//
//   closed   no failure since the last success: the webhook's full concurrency.
//   failing  the last attempt failed: one attempt at a time, until one succeeds.
//   open     `openAfter` attempts in a row failed: nothing but one probe attempt every
//            `probeEveryMs`; its deliveries wait in the database, due. A probe that succeeds
//            closes the breaker and they drain at full speed.
//
// Retries only wait longer than their schedule says while the endpoint fails; the schedule counts
// attempts, not time, so no delivery loses an attempt to the breaker. Pure: no broker, no clock
// of its own (callers pass `now`).

export interface BreakerOptions {
	/** Failed attempts in a row that open the breaker. */
	openAfter: number;
	/** While open, one probe attempt this often. */
	probeEveryMs: number;
}

interface FailingEndpoint {
	failures: number;
	/** While open: when the next probe may start. */
	probeAt: number;
}

export type BreakerChange = "opened" | "closed" | null;

export class EndpointBreakers {
	private readonly failing = new Map<string, FailingEndpoint>();

	constructor(private readonly options: BreakerOptions) {}

	/** Records an attempt's outcome; says whether it opened or closed the breaker. */
	record(webhookId: string, success: boolean, now: number): BreakerChange {
		const endpoint = this.failing.get(webhookId);
		if (success) {
			if (!endpoint) return null;
			this.failing.delete(webhookId);
			return this.isOpenEntry(endpoint) ? "closed" : null;
		}
		const failures = (endpoint?.failures ?? 0) + 1;
		this.failing.set(webhookId, { failures, probeAt: now + this.options.probeEveryMs });
		return failures === this.options.openAfter ? "opened" : null;
	}

	/** How many attempts of the webhook may be in flight now. */
	attemptLimit(webhookId: string, normal: number, now: number): number {
		const endpoint = this.failing.get(webhookId);
		if (!endpoint) return normal;
		if (!this.isOpenEntry(endpoint)) return 1;
		return endpoint.probeAt <= now ? 1 : 0;
	}

	/** Open: its deliveries are not leased, except for a probe once one is due. */
	isOpen(webhookId: string): boolean {
		const endpoint = this.failing.get(webhookId);
		return endpoint !== undefined && this.isOpenEntry(endpoint);
	}

	/** The open breakers, each with whether a probe may start now. */
	open(now: number): Array<{ webhookId: string; probeDue: boolean }> {
		const open: Array<{ webhookId: string; probeDue: boolean }> = [];
		for (const [webhookId, endpoint] of this.failing) {
			if (this.isOpenEntry(endpoint)) open.push({ webhookId, probeDue: endpoint.probeAt <= now });
		}
		return open;
	}

	/** The webhook was removed, re-enabled or changed its URL: start from nothing. */
	forget(webhookId: string): void {
		this.failing.delete(webhookId);
	}

	private isOpenEntry(endpoint: FailingEndpoint): boolean {
		return endpoint.failures >= this.options.openAfter;
	}
}
