// A circuit breaker per webhook endpoint, as one dispatcher instance sees it. An endpoint that
// fails every attempt would otherwise be attempted as fast as its due retries come up: with a
// pile of due retries that is a request, a result write and an attempt row every millisecond,
// taken from the healthy endpoints sharing the event loop and the database writer (the bad-
// neighbour benchmark measured about a thousand such attempts a second).
//
//   closed   no failure since the last success: the webhook's full concurrency.
//   failing  the last attempt failed: one attempt at a time, until one succeeds.
//   open     `openAfter` attempts in a row failed, and none succeeded for `quietMs`: nothing but
//            one probe attempt every `probeEveryMs`; its deliveries wait in the database, due. A
//            probe that succeeds closes the breaker and they drain at full speed.
//
// An endpoint that answers some deliveries and refuses others is not down: with ordering per
// order, a receiver that keeps refusing a thousand orders (and their later statuses wait) failed
// a thousand attempts in a row, and its breaker, open, probed only those, due longest, one a
// second: the webhook's healthy orders waited for all of them (the ordering benchmark's bad
// neighbour: not one healthy delivery in the run). So a success within `quietMs` keeps the breaker
// from opening, and probes take turns between the row due longest and the never-attempted one due
// last, which is fresh traffic when there is any.
//
// Retries only wait longer than their schedule says while the endpoint fails; the schedule counts
// attempts, not time, so no delivery loses an attempt to the breaker. Pure: no broker, no clock
// of its own (callers pass `now`).

export interface BreakerOptions {
	/** Failed attempts in a row that open the breaker. */
	openAfter: number;
	/** While open, one probe attempt this often. */
	probeEveryMs: number;
	/** A success this recent keeps the breaker from opening. */
	quietMs: number;
}

interface FailingEndpoint {
	failures: number;
	open: boolean;
	/** While open: when the next probe may start. */
	probeAt: number;
	/** Probes made while open; odd ones take the row due last. */
	probes: number;
}

export type BreakerChange = "opened" | "closed" | null;

export class EndpointBreakers {
	private readonly failing = new Map<string, FailingEndpoint>();
	/** When each endpoint last answered a delivery with success, while that is within quietMs. */
	private readonly succeededAt = new Map<string, number>();

	constructor(private readonly options: BreakerOptions) {}

	/** Records an attempt's outcome; says whether it opened or closed the breaker. */
	record(webhookId: string, success: boolean, now: number): BreakerChange {
		const endpoint = this.failing.get(webhookId);
		if (success) {
			this.succeededAt.set(webhookId, now);
			if (!endpoint) return null;
			this.failing.delete(webhookId);
			return endpoint.open ? "closed" : null;
		}
		const lastSuccess = this.succeededAt.get(webhookId);
		const quiet = lastSuccess === undefined || now - lastSuccess >= this.options.quietMs;
		if (quiet) this.succeededAt.delete(webhookId);
		const failures = (endpoint?.failures ?? 0) + 1;
		const open = endpoint?.open === true || (failures >= this.options.openAfter && quiet);
		this.failing.set(webhookId, { failures, open, probeAt: now + this.options.probeEveryMs, probes: endpoint?.probes ?? 0 });
		return open && endpoint?.open !== true ? "opened" : null;
	}

	/** For an open breaker's next probe: whether it takes the row due last rather than the one due longest. */
	probeTakesNewest(webhookId: string): boolean {
		const endpoint = this.failing.get(webhookId);
		if (!endpoint) return false;
		endpoint.probes += 1;
		return endpoint.probes % 2 === 0;
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
		this.succeededAt.delete(webhookId);
	}

	private isOpenEntry(endpoint: FailingEndpoint): boolean {
		return endpoint.open;
	}
}
