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

export interface CachedList<T> {
	value: T[];
	/** Loaded for this call, not taken from the cache. */
	loaded: boolean;
}

export class SubscriberCache<T> {
	private entries = new Map<string, { value: T[]; until: number }>();
	// Bumped by every forget() and clear(): a load that started before any of them is not kept.
	private version = 0;

	/**
	 * @param keepUntil until when (ms since the epoch) a list loaded at `loadedAt` may be used,
	 * even if no change is ever announced.
	 * @param maxEntries beyond this many keys the oldest entries go first.
	 */
	constructor(
		private readonly keepUntil: (value: T[], loadedAt: number) => number,
		private readonly maxEntries = 10_000,
		private readonly now: () => number = Date.now,
	) {}

	get size(): number {
		return this.entries.size;
	}

	/** The cached list for `key` until its deadline, otherwise `load()`'s (kept if nothing changed meanwhile). */
	async get(key: string, load: () => Promise<T[]>): Promise<CachedList<T>> {
		const cached = this.entries.get(key);
		if (cached && this.now() <= cached.until) return { value: cached.value, loaded: false };
		const versionAtStart = this.version;
		const loadedAt = this.now();
		const value = await load();
		if (this.version === versionAtStart) this.keep(key, value, this.keepUntil(value, loadedAt));
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

	private keep(key: string, value: T[], until: number): void {
		// Re-inserted so that Map order stays oldest first.
		this.entries.delete(key);
		this.entries.set(key, { value, until });
		if (this.entries.size > this.maxEntries) this.entries.delete(this.entries.keys().next().value!);
	}
}
