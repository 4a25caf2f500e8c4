// Whether a user wants the email of an event, kept per user so that the notifier's intake need
// not ask the users service for every event (in cluster mode a NATS round trip and a users-table
// read each time). Intake writes no outbox row for a user known not to want the email, so a stale
// "off" is what would lose an email: someone who just turned email on must get the next one.
//
// So the owner drops a user's entry when the users service announces a change to it (it
// broadcasts after storing the change, before it answers the request that made it), clears
// everything when it may have missed an announcement (its connection or a peer's dropped), and no
// entry outlives its time to live whatever happens. A stale "on" costs only an outbox row: the
// worker asks the users service again before sending, and skips it.
//
// One load per key at a time: the events of one user that arrive together wait for the same
// answer. A load that was under way when its key was dropped answers the callers that were
// already waiting (they asked before the change) but is not kept, and a caller that comes after
// the drop starts a fresh load. A failed load is not kept either: the next caller tries again.

export interface EmailPreferenceCacheOptions {
	/** How long an entry is used without any announcement, in ms. */
	ttlMs: number;
	/** Beyond this many users the oldest entries go first. */
	maxEntries?: number;
	now?: () => number;
}

interface Entry<V> {
	value: V;
	until: number;
}

export class EmailPreferenceCache<V> {
	private readonly entries = new Map<string, Entry<V>>();
	private readonly loading = new Map<string, Promise<V>>();
	private readonly ttlMs: number;
	private readonly maxEntries: number;
	private readonly now: () => number;

	constructor(options: EmailPreferenceCacheOptions) {
		this.ttlMs = options.ttlMs;
		this.maxEntries = options.maxEntries ?? 100_000;
		this.now = options.now ?? Date.now;
	}

	get size(): number {
		return this.entries.size;
	}

	/** The cached value for `key` until it expires, otherwise `load()`'s (shared by concurrent callers). */
	get(key: string, load: () => Promise<V>): Promise<V> {
		const cached = this.entries.get(key);
		if (cached) {
			if (this.now() <= cached.until) return Promise.resolve(cached.value);
			this.entries.delete(key);
		}
		const pending = this.loading.get(key);
		if (pending) return pending;
		const loadedAt = this.now();
		const loaded = load().then(
			value => {
				// Dropped meanwhile (forget or clear took it out of `loading`): answer, do not keep.
				if (this.loading.get(key) === loaded) {
					this.loading.delete(key);
					this.keep(key, value, loadedAt);
				}
				return value;
			},
			(err: unknown) => {
				if (this.loading.get(key) === loaded) this.loading.delete(key);
				throw err;
			},
		);
		this.loading.set(key, loaded);
		return loaded;
	}

	/** A change to this key was announced. */
	forget(key: string): void {
		this.entries.delete(key);
		this.loading.delete(key);
	}

	/** Announcements may have been missed: nothing cached can be trusted. */
	clear(): void {
		this.entries.clear();
		this.loading.clear();
	}

	private keep(key: string, value: V, loadedAt: number): void {
		// Re-inserted so that Map order stays oldest first.
		this.entries.delete(key);
		this.entries.set(key, { value, until: loadedAt + this.ttlMs });
		if (this.entries.size > this.maxEntries) this.entries.delete(this.entries.keys().next().value!);
	}
}
