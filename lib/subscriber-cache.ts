// The subscribed webhooks of a customer, kept between intake batches so that a batch need not ask
// the webhooks service every time (in cluster mode that is a NATS round trip before each write).
//
// Staleness is what would lose a delivery: an event accepted after a webhook was created must
// reach it. So the owner drops a customer's entry on every webhooks.* change it is told of (the
// webhooks service broadcasts them before it answers the request that made the change), clears
// everything when it may have missed such a message (its connection or a peer's dropped), and no
// entry outlives the deadline `keepUntil` gives it whatever happens. A load that was under way
// while anything was dropped is used by the batch that asked for it but not kept: it may predate
// the change.
//
// Refresh ahead: an entry used in the last part of its life (past REFRESH_AHEAD of it) is loaded
// again in the background while the batch goes on with the entry it has. Without it, the first
// batch of a busy customer after each deadline waited for the load; in the cluster benchmark that
// was a NATS round trip to the gateway every 5 s, with every event of the batch held behind it.
// The deadline is untouched: an entry whose refresh has not landed by then is not used, and the
// next batch loads in the foreground as before.

export interface CachedList<T> {
	value: T[];
	/** Loaded for this call, not taken from the cache. */
	loaded: boolean;
}

/** The share of an entry's life after which using it starts a background refresh. */
export const REFRESH_AHEAD = 0.8;

export interface SubscriberCacheOptions<T> {
	/** Beyond this many keys the oldest entries go first. */
	maxEntries?: number;
	now?: () => number;
	/** Told of every list a background refresh kept (the owner refreshes what it derived from the old one). */
	onRefreshed?: (key: string, value: T[]) => void;
}

interface Entry<T> {
	value: T[];
	loadedAt: number;
	until: number;
	/** Used after this, the entry is loaded again in the background. */
	refreshAfter: number;
}

export class SubscriberCache<T> {
	private entries = new Map<string, Entry<T>>();
	// Bumped by every forget() and clear(): a load that started before any of them is not kept.
	private version = 0;
	private readonly refreshing = new Set<string>();
	private readonly maxEntries: number;
	private readonly now: () => number;
	private readonly onRefreshed?: (key: string, value: T[]) => void;

	/**
	 * @param keepUntil until when (ms since the epoch) a list loaded at `loadedAt` may be used,
	 * even if no change is ever announced.
	 */
	constructor(
		private readonly keepUntil: (value: T[], loadedAt: number) => number,
		options: SubscriberCacheOptions<T> = {},
	) {
		this.maxEntries = options.maxEntries ?? 10_000;
		this.now = options.now ?? Date.now;
		this.onRefreshed = options.onRefreshed;
	}

	get size(): number {
		return this.entries.size;
	}

	/** The cached list for `key` until its deadline, otherwise `load()`'s (kept if nothing changed meanwhile). */
	async get(key: string, load: () => Promise<T[]>): Promise<CachedList<T>> {
		const cached = this.entries.get(key);
		const now = this.now();
		if (cached && now <= cached.until) {
			if (now >= cached.refreshAfter) this.refreshInBackground(key, load);
			return { value: cached.value, loaded: false };
		}
		const versionAtStart = this.version;
		const value = await load();
		if (this.version === versionAtStart) this.keep(key, value, now);
		return { value, loaded: true };
	}

	/** A change to one key's webhooks was announced. */
	forget(key: string): void {
		this.version += 1;
		this.entries.delete(key);
	}

	/** Announcements may have been missed: nothing cached can be trusted. */
	clear(): void {
		this.version += 1;
		this.entries.clear();
	}

	/** One refresh per key at a time; a failed one leaves the entry to its deadline. */
	private refreshInBackground(key: string, load: () => Promise<T[]>): void {
		if (this.refreshing.has(key)) return;
		this.refreshing.add(key);
		const versionAtStart = this.version;
		const loadedAt = this.now();
		load().then(
			value => {
				this.refreshing.delete(key);
				// Something was forgotten meanwhile, or a load that started later (the entry ran out
				// while this one was slow) is already in: this one is not kept.
				if (this.version !== versionAtStart || (this.entries.get(key)?.loadedAt ?? -Infinity) > loadedAt) return;
				this.keep(key, value, loadedAt);
				this.onRefreshed?.(key, value);
			},
			// Nobody waits for this load: the batch after the deadline loads again and meets the error.
			() => this.refreshing.delete(key),
		);
	}

	private keep(key: string, value: T[], loadedAt: number): void {
		const until = this.keepUntil(value, loadedAt);
		// Re-inserted so that Map order stays oldest first.
		this.entries.delete(key);
		this.entries.set(key, { value, loadedAt, until, refreshAfter: loadedAt + (until - loadedAt) * REFRESH_AHEAD });
		if (this.entries.size > this.maxEntries) this.entries.delete(this.entries.keys().next().value!);
	}
}
