// How fast each webhook's queue of leased deliveries drains on this instance: deliveries answered
// 200 per second, measured only while the webhook had more leased than it was sending, so the
// figure is what its receiver and this instance can do, not how much traffic happened to come.
// The dispatcher sizes each webhook's share of leases by it (worker.mixin.ts): a fast webhook may
// hold about 20 s of its own sending, a slow one no more than the fixed share.
//
// A rate is kept through idle spells, where there is nothing to measure, so that the next burst
// starts from the last one. It is measured again, second by second, whenever the webhook is busy.
// The rate given is the best of the last RATE_WINDOWS seconds measured since the receiver last
// failed an attempt: a receiver that fails lowers it within a second of being busy, one that only
// slows down within RATE_WINDOWS seconds. A slow second with no failure may be this instance's own:
// a burst's intake can starve the sender for a second, and in the cluster benchmark such a second
// (36-46 a second, against 180-300 before and after) cut every webhook's share below what it held,
// so that intake left 40 % of a burst of 50,000 for claims, each a second write and a body read.
// A share is half the lease's headroom (leaseAheadMs), and a queued delivery whose lease could run
// out is given back unattempted, so two seconds more at the old rate stay within it. Failures end
// the grace at once: for a webhook whose failing retries share its queue with healthy deliveries,
// a share kept large would lease more of those retries at once, ahead of the healthy ones.

const WINDOW_MS = 1_000;
const RATE_WINDOWS = 3;
// Past this many webhooks the oldest measured are forgotten (they start again from the fixed share).
export const MAX_TRACKED_WEBHOOKS = 100_000;

interface Window {
	since: number;
	succeeded: number;
	failed: boolean;
}

export class DrainRates {
	private readonly windows = new Map<string, Window>();
	/** Each webhook's last RATE_WINDOWS measured rates, oldest first. */
	private readonly rates = new Map<string, number[]>();

	/**
	 * One attempt of the webhook ended. `queued`: more of its leased deliveries were waiting for a
	 * slot, so the webhook was sending as fast as it could. A window that is not busy throughout
	 * is dropped, not measured.
	 */
	noteAttempt(webhookId: string, succeeded: boolean, queued: boolean, now: number): void {
		if (!queued) {
			this.windows.delete(webhookId);
			return;
		}
		const window = this.windows.get(webhookId);
		if (!window) {
			// A window whose webhook stopped mid-queue (disabled, its deliveries parked) is never
			// closed by an attempt: the oldest go first past the bound.
			this.windows.set(webhookId, { since: now, succeeded: 0, failed: !succeeded });
			if (this.windows.size > MAX_TRACKED_WEBHOOKS) this.windows.delete(this.windows.keys().next().value!);
			return;
		}
		if (succeeded) window.succeeded += 1;
		else window.failed = true;
		const elapsed = now - window.since;
		if (elapsed < WINDOW_MS) return;
		const recent = window.failed ? [] : (this.rates.get(webhookId) ?? []);
		recent.push((window.succeeded * 1_000) / elapsed);
		if (recent.length > RATE_WINDOWS) recent.shift();
		this.rates.delete(webhookId); // re-inserted last: the Map's order is then oldest measured first
		this.rates.set(webhookId, recent);
		if (this.rates.size > MAX_TRACKED_WEBHOOKS) this.rates.delete(this.rates.keys().next().value!);
		window.since = now;
		window.succeeded = 0;
		window.failed = false;
	}

	/** Deliveries per second the webhook's queue drained at while busy: the best of its last RATE_WINDOWS seconds measured, back to its last failure; 0 if never measured. */
	perSecond(webhookId: string): number {
		return Math.max(0, ...(this.rates.get(webhookId) ?? []));
	}

	forget(webhookId: string): void {
		this.windows.delete(webhookId);
		this.rates.delete(webhookId);
	}
}
