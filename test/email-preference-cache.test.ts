// The notifier's per-user preference cache (lib/email-preference-cache.ts), on a clock the test
// moves: entries expire, concurrent callers share one load, a drop wins over a load under way,
// failures are not kept, and the size stays bounded.
import { EmailPreferenceCache } from "../lib/email-preference-cache";

function deferred<T>(): { promise: Promise<T>; resolve(value: T): void; reject(err: Error): void } {
	let resolve!: (value: T) => void;
	let reject!: (err: Error) => void;
	const promise = new Promise<T>((ok, fail) => ((resolve = ok), (reject = fail)));
	return { promise, resolve, reject };
}

describe("EmailPreferenceCache", () => {
	let now = 1_000;
	const cache = (maxEntries?: number) => new EmailPreferenceCache<string>({ ttlMs: 30_000, maxEntries, now: () => now });

	it("answers from the cache until the entry expires, then loads again", async () => {
		const preferences = cache();
		const load = jest.fn(async () => "off");
		expect(await preferences.get("alice", load)).toBe("off");
		now += 30_000;
		expect(await preferences.get("alice", load)).toBe("off");
		expect(load).toHaveBeenCalledTimes(1);
		now += 1;
		load.mockResolvedValueOnce("on");
		expect(await preferences.get("alice", load)).toBe("on");
		expect(load).toHaveBeenCalledTimes(2);
	});

	it("makes one load for callers that ask for the same user at once", async () => {
		const preferences = cache();
		const pending = deferred<string>();
		const load = jest.fn(() => pending.promise);
		const answers = Promise.all([preferences.get("bob", load), preferences.get("bob", load), preferences.get("bob", load)]);
		pending.resolve("off");
		expect(await answers).toEqual(["off", "off", "off"]);
		expect(load).toHaveBeenCalledTimes(1);
		expect(await preferences.get("bob", load)).toBe("off");
		expect(load).toHaveBeenCalledTimes(1);
	});

	it("forgets a user on an announced change, even while that user's load is under way", async () => {
		const preferences = cache();
		await preferences.get("carol", async () => "off");
		preferences.forget("carol");
		expect(await preferences.get("carol", async () => "on")).toBe("on");

		// A load that began before the change answers the caller who was waiting, and is not kept.
		const early = deferred<string>();
		const waiting = preferences.get("carol-2", () => early.promise);
		preferences.forget("carol-2");
		const fresh = preferences.get("carol-2", async () => "on");
		early.resolve("off");
		expect(await waiting).toBe("off");
		expect(await fresh).toBe("on");
		expect(await preferences.get("carol-2", async () => "never asked")).toBe("on");
	});

	it("clear() drops every entry and every load under way", async () => {
		const preferences = cache();
		await preferences.get("dave", async () => "off");
		const early = deferred<string>();
		const waiting = preferences.get("erin", () => early.promise);
		preferences.clear();
		early.resolve("off");
		await waiting;
		expect(preferences.size).toBe(0);
		expect(await preferences.get("dave", async () => "on")).toBe("on");
		expect(await preferences.get("erin", async () => "on")).toBe("on");
	});

	it("keeps no failed load: every waiting caller gets the error, the next one loads again", async () => {
		const preferences = cache();
		const failing = deferred<string>();
		const callers = [preferences.get("frank", () => failing.promise), preferences.get("frank", () => failing.promise)];
		failing.reject(new Error("users is away"));
		for (const caller of callers) await expect(caller).rejects.toThrow("users is away");
		expect(preferences.size).toBe(0);
		expect(await preferences.get("frank", async () => "off")).toBe("off");
	});

	it("stays within its bound, the oldest entry going first", async () => {
		const preferences = cache(2);
		for (const user of ["u1", "u2", "u3"]) await preferences.get(user, async () => `${user}-off`);
		expect(preferences.size).toBe(2);
		expect(await preferences.get("u3", async () => "reloaded")).toBe("u3-off");
		expect(await preferences.get("u1", async () => "reloaded")).toBe("reloaded");
	});
});
