// The dispatcher's pure helpers: the message body, time-ordered ids, the micro-batcher, the
// subscriber cache and the webhooks' drain rates.
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import { orderStatusMessage } from "../lib/schemas/deliveries";
import { TaskingOrderStatusEvent } from "../lib/schemas/events";
import { timeOfOrderedUuid, timeOrderedUuid } from "../lib/ids";
import { MicroBatcher, type BusyLinger } from "../lib/micro-batcher";
import { SubscriberCache } from "../lib/subscriber-cache";
import { DrainRates, MAX_TRACKED_WEBHOOKS } from "../lib/drain-rates";

describe("orderStatusMessage", () => {
	const event = (extra: Record<string, unknown> = {}) =>
		TaskingOrderStatusEvent.parse({ user_id: "alice", order_id: "o-1", status: "Expired", ...extra });

	it("puts the core keys first, with null for absent optional fields", () => {
		const body = orderStatusMessage(event(), "tasking:order_status", "2026-01-01T00:00:00.000Z");
		expect(body).toBe(
			'{"type":"tasking:order_status","timestamp":"2026-01-01T00:00:00.000Z","data":{"order_id":"o-1","status":"expired","previous_status":null,"user_id":"alice","order_name":null}}',
		);
	});

	it("passes details through, but core keys win and __proto__ stays a plain key", () => {
		const details = JSON.parse('{"order_id":"forged","user_id":"mallory","cloud_cover":0.1,"__proto__":{"polluted":true}}');
		// Straight from JSON.parse, as a producer's payload could arrive without the schema's copy.
		const body = JSON.parse(orderStatusMessage({ ...event(), details }, "tasking:order_status", "2026-01-01T00:00:00.000Z"));
		expect(body.data.order_id).toBe("o-1");
		expect(body.data.user_id).toBe("alice");
		expect(body.data.cloud_cover).toBe(0.1);
		expect(Object.keys(body.data)).toContain("__proto__");
		expect(({} as Record<string, unknown>).polluted).toBeUndefined();
	});
});

describe("timeOrderedUuid", () => {
	it("makes RFC 9562 version 7 UUIDs that sort by creation time", () => {
		const ids = Array.from({ length: 50 }, (_, i) => timeOrderedUuid(1_700_000_000_000 + i * 7));
		for (const id of ids) expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
		expect([...ids].sort()).toEqual(ids);
		expect(new Set(Array.from({ length: 1000 }, () => timeOrderedUuid(0))).size).toBe(1000);
	});

	it("strictly increases within one millisecond, past the counter's end, and when the clock steps back a little", () => {
		const sameMillisecond = Array.from({ length: 10_000 }, () => timeOrderedUuid(1_800_000_000_000));
		const steppedBack = Array.from({ length: 10 }, (_, i) => timeOrderedUuid(1_800_000_000_000 - i * 50));
		const ids = [...sameMillisecond, ...steppedBack];
		for (const id of ids) expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
		for (let i = 1; i < ids.length; i++) expect(ids[i] > ids[i - 1]).toBe(true);
		// 10,000 ids take three or four milliseconds of 4,096 counts (the first count starts below 2,048).
		expect(timeOfOrderedUuid(ids.at(-1)!)! - 1_800_000_000_000).toBeGreaterThanOrEqual(2);
		expect(timeOfOrderedUuid(ids.at(-1)!)! - 1_800_000_000_000).toBeLessThanOrEqual(3);
	});

	it("gives its creation time back, and none for ids of another version or shape", () => {
		expect(timeOfOrderedUuid(timeOrderedUuid(1_750_000_000_123))).toBe(1_750_000_000_123);
		expect(timeOfOrderedUuid(timeOrderedUuid(1_750_000_000_123).toUpperCase())).toBe(1_750_000_000_123);
		for (const other of [crypto.randomUUID(), "", "not-a-uuid", "0192zzzz-0000-7000-8000-000000000000", `${timeOrderedUuid()}x`]) expect(timeOfOrderedUuid(other)).toBeNull();
	});
});

describe("MicroBatcher", () => {
	it("hands items that arrive together to one batch, and answers each with its own result", async () => {
		const batches: number[][] = [];
		const batcher = new MicroBatcher<number, number>(async items => {
			batches.push(items);
			return items.map(item => item * 10);
		});
		const results = await Promise.all([1, 2, 3].map(item => batcher.add(item)));
		expect(results).toEqual([10, 20, 30]);
		expect(batches).toEqual([[1, 2, 3]]);
	});

	it("lets items that arrive while a batch runs form the next batch, up to maxBatch each", async () => {
		const batches: number[][] = [];
		let release: () => void = () => {};
		const batcher = new MicroBatcher<number, number>(async items => {
			batches.push(items);
			if (batches.length === 1) await new Promise<void>(resolve => (release = resolve));
			return items;
		}, 2);
		const first = batcher.add(1);
		await new Promise(resolve => setImmediate(resolve));
		const later = [2, 3, 4].map(item => batcher.add(item));
		release();
		await Promise.all([first, ...later]);
		expect(batches).toEqual([[1], [2, 3], [4]]);
	});

	it("rejects every item of a failed batch and keeps working", async () => {
		let fail = true;
		const batcher = new MicroBatcher<string, string>(async items => {
			if (fail) throw new Error("database down");
			return items;
		});
		await expect(Promise.all([batcher.add("a"), batcher.add("b")])).rejects.toThrow("database down");
		fail = false;
		await expect(batcher.add("c")).resolves.toBe("c");
		await batcher.drain();
		expect(batcher.size).toBe(0);
	});

	it("hands the waiting items to another writer, which answers or fails them; the batch it took them from runs empty", async () => {
		const batches: number[][] = [];
		const batcher = new MicroBatcher<number, number>(async items => {
			batches.push(items);
			return items;
		}, 2, 20);
		const answered = [1, 2, 3].map(item => batcher.add(item));
		const taken = batcher.takeWaiting()!;
		// At most maxBatch, oldest first; the rest stays for the batcher's own batch.
		expect(taken.items).toEqual([1, 2]);
		taken.settle([10, 20]);
		await expect(Promise.all(answered)).resolves.toEqual([10, 20, 3]);
		expect(batches).toEqual([[3]]);

		const failing = batcher.add(4);
		batcher.takeWaiting()!.fail(new Error("transaction rolled back"));
		await expect(failing).rejects.toThrow("transaction rolled back");
		await batcher.drain();
		expect(batches).toEqual([[3]]);
		expect(batcher.takeWaiting()).toBeNull();
	});

	/** A batcher that records its batches, and two items added 5 ms apart. */
	const recording = (lingerMs: number, busyLinger?: BusyLinger) => {
		const batches: string[][] = [];
		const batcher = new MicroBatcher<string, string>(
			async items => {
				batches.push(items);
				return items;
			},
			100,
			lingerMs,
			busyLinger,
		);
		const addApart = async () => {
			const first = batcher.add("a");
			await sleep(5);
			await Promise.all([first, batcher.add("b")]);
		};
		return { batches, addApart };
	};

	it("waits lingerMs for company when asked to", async () => {
		const { batches, addApart } = recording(30);
		await addApart();
		expect(batches).toEqual([["a", "b"]]);
	});

	describe("with a busy linger", () => {
		const busyLinger = { utilisation: 0.7, lingerMs: 50 };

		it("starts at once while the event loop is quiet", async () => {
			// A loop read as 20 % busy: in full runs on the loaded 2-core machine, the sleeping jest
			// worker's own loop read above 0.7, and once above 0.95, and the batch lingered.
			const { batches, addApart } = recording(0, { ...busyLinger, readUtilisation: () => 0.2 });
			await sleep(150);
			await addApart();
			expect(batches).toEqual([["a"], ["b"]]);
		});

		it("lingers while the event loop is saturated, so that items a few milliseconds apart share a batch", async () => {
			const { batches, addApart } = recording(0, busyLinger);
			// Keep this thread's loop busy past the sample period, as a burst of work would.
			const until = performance.now() + 150;
			while (performance.now() < until);
			await addApart();
			expect(batches).toEqual([["a", "b"]]);
		});
	});
});

describe("SubscriberCache", () => {
	let clock = 0;
	const cache = () => new SubscriberCache<string>((_value, loadedAt) => loadedAt + 1_000, { maxEntries: 2, now: () => clock });
	const loader = (value: string[]) => jest.fn(async () => value);
	beforeEach(() => (clock = 0));

	it("loads once, then answers from the cache until the entry's deadline", async () => {
		const subscribers = cache();
		const load = loader(["w1"]);
		expect(await subscribers.get("acme", load)).toEqual({ value: ["w1"], loaded: true });
		// Before REFRESH_AHEAD of its life: no load at all.
		clock = 799;
		expect(await subscribers.get("acme", load)).toEqual({ value: ["w1"], loaded: false });
		clock = 1_001;
		expect(await subscribers.get("acme", load)).toEqual({ value: ["w1"], loaded: true });
		expect(load).toHaveBeenCalledTimes(2);
	});

	/** A load that finishes when the test says so. */
	const gatedLoad = () => {
		const gates: Array<{ resolve(value: string[]): void; reject(error: Error): void }> = [];
		const load = jest.fn(() => new Promise<string[]>((resolve, reject) => gates.push({ resolve, reject })));
		return { load, gates };
	};
	const settled = () => new Promise(resolve => setImmediate(resolve));
	/** `subscribers` holding ["w1"] for "acme" (loaded at 0, due at 1,000), used at 850: its refresh is under way until the test settles it. */
	const refreshUnderWay = async (subscribers = cache()) => {
		await subscribers.get("acme", loader(["w1"]));
		const { load, gates } = gatedLoad();
		clock = 850;
		expect(await subscribers.get("acme", load)).toEqual({ value: ["w1"], loaded: false });
		return { subscribers, load, gates };
	};

	it("refreshes an entry used late in its life in the background, answering from it meanwhile", async () => {
		const refreshed: Array<[string, string[]]> = [];
		const { subscribers, load, gates } = await refreshUnderWay(
			new SubscriberCache<string>((_value, loadedAt) => loadedAt + 1_000, { now: () => clock, onRefreshed: (key, value) => refreshed.push([key, value]) }),
		);
		clock = 900;
		expect(await subscribers.get("acme", load)).toEqual({ value: ["w1"], loaded: false });
		// One refresh at a time.
		expect(load).toHaveBeenCalledTimes(1);
		gates[0].resolve(["w1", "w2"]);
		await settled();
		expect(refreshed).toEqual([["acme", ["w1", "w2"]]]);
		// Past the first deadline, within the refreshed entry's (loaded at 850).
		clock = 1_500;
		expect(await subscribers.get("acme", load)).toEqual({ value: ["w1", "w2"], loaded: false });
		expect(load).toHaveBeenCalledTimes(1);
		clock = 1_851;
		gates.length = 0;
		const foreground = subscribers.get("acme", load);
		gates[0].resolve(["w3"]);
		expect(await foreground).toEqual({ value: ["w3"], loaded: true });
	});

	it("does not keep a background refresh that was under way while something was forgotten", async () => {
		const refreshed: string[][] = [];
		const { subscribers, gates } = await refreshUnderWay(
			new SubscriberCache<string>((_value, loadedAt) => loadedAt + 1_000, { now: () => clock, onRefreshed: (_key, value) => refreshed.push(value) }),
		);
		subscribers.forget("globex");
		gates[0].resolve(["old"]);
		await settled();
		expect(refreshed).toEqual([]);
		// The entry it would have replaced still ends at its own deadline.
		clock = 1_001;
		expect(await subscribers.get("acme", loader(["new"]))).toEqual({ value: ["new"], loaded: true });
	});

	it("does not let a slow background refresh replace a list loaded after it", async () => {
		const { subscribers, gates } = await refreshUnderWay();
		// The entry runs out while the refresh is slow: the next batch loads in the foreground.
		clock = 1_001;
		expect(await subscribers.get("acme", loader(["newer"]))).toEqual({ value: ["newer"], loaded: true });
		gates[0].resolve(["older"]);
		await settled();
		clock = 1_500;
		expect(await subscribers.get("acme", loader(["unused"]))).toEqual({ value: ["newer"], loaded: false });
	});

	it("leaves an entry whose background refresh failed to its deadline; the load after it meets the error", async () => {
		const { subscribers, load, gates } = await refreshUnderWay();
		gates[0].reject(new Error("webhooks unavailable"));
		await settled();
		clock = 1_000;
		expect(await subscribers.get("acme", load)).toEqual({ value: ["w1"], loaded: false });
		clock = 1_001;
		await expect(subscribers.get("acme", () => Promise.reject(new Error("webhooks unavailable")))).rejects.toThrow("webhooks unavailable");
	});

	it("loads again after forget(key) or clear(), and only for the key forgotten", async () => {
		const subscribers = cache();
		const acme = loader(["w1"]);
		const globex = loader(["w2"]);
		await subscribers.get("acme", acme);
		await subscribers.get("globex", globex);
		subscribers.forget("acme");
		expect((await subscribers.get("acme", acme)).loaded).toBe(true);
		expect((await subscribers.get("globex", globex)).loaded).toBe(false);
		subscribers.clear();
		expect((await subscribers.get("globex", globex)).loaded).toBe(true);
	});

	it("does not keep a load that was under way while something was forgotten: it may predate the change", async () => {
		const subscribers = cache();
		let finish!: (value: string[]) => void;
		const slow = jest.fn(() => new Promise<string[]>(resolve => (finish = resolve)));
		const pending = subscribers.get("acme", slow);
		subscribers.forget("globex");
		finish(["old"]);
		// The batch that asked still gets what it loaded.
		expect(await pending).toEqual({ value: ["old"], loaded: true });
		expect(await subscribers.get("acme", loader(["new"]))).toEqual({ value: ["new"], loaded: true });
		expect(await subscribers.get("acme", loader(["newer"]))).toEqual({ value: ["new"], loaded: false });
	});

	it("takes each entry's deadline from what was loaded (a secret's grace ending before the usual age)", async () => {
		const subscribers = new SubscriberCache<{ until: number }>((value, loadedAt) => Math.min(loadedAt + 1_000, ...value.map(item => item.until)), { maxEntries: 10, now: () => clock });
		const load = jest.fn(async () => [{ until: 300 }]);
		await subscribers.get("acme", load);
		clock = 300;
		expect((await subscribers.get("acme", load)).loaded).toBe(false);
		clock = 301;
		expect((await subscribers.get("acme", load)).loaded).toBe(true);
	});

	it("keeps a failed load out of the cache and passes the error on", async () => {
		const subscribers = cache();
		await expect(subscribers.get("acme", () => Promise.reject(new Error("webhooks unavailable")))).rejects.toThrow("webhooks unavailable");
		expect(subscribers.size).toBe(0);
	});

	it("holds at most maxEntries customers, dropping the oldest", async () => {
		const subscribers = cache();
		await subscribers.get("a", loader(["1"]));
		await subscribers.get("b", loader(["2"]));
		await subscribers.get("c", loader(["3"]));
		expect(subscribers.size).toBe(2);
		expect((await subscribers.get("c", loader(["x"]))).loaded).toBe(false);
		expect((await subscribers.get("a", loader(["1"]))).loaded).toBe(true);
	});
});

describe("DrainRates", () => {
	/** Attempts of one webhook every `everyMs` from `from` to `to`, all with more queued behind them unless told. */
	const attempts = (rates: DrainRates, webhookId: string, from: number, to: number, everyMs: number, opts: { succeeded?: (at: number) => boolean; queued?: boolean } = {}) => {
		for (let at = from; at <= to; at += everyMs) rates.noteAttempt(webhookId, opts.succeeded?.(at) ?? true, opts.queued ?? true, at);
	};
	/** The same, then the queue runs empty: the burst's last attempt ends with nothing behind it. */
	const burst = (rates: DrainRates, webhookId: string, from: number, to: number, everyMs: number, succeeded?: (at: number) => boolean) => {
		attempts(rates, webhookId, from, to, everyMs, { succeeded });
		rates.noteAttempt(webhookId, true, false, to + 1);
	};

	it("measures successes per second over a second in which the webhook had deliveries queued", () => {
		const rates = new DrainRates();
		expect(rates.perSecond("w")).toBe(0);
		attempts(rates, "w", 0, 999, 2);
		expect(rates.perSecond("w")).toBe(0); // not a whole second yet
		attempts(rates, "w", 1_000, 1_000, 1);
		expect(rates.perSecond("w")).toBe(500);
		expect(rates.perSecond("other")).toBe(0);
	});

	it("measures nothing while the webhook keeps up with what comes: that rate is the traffic's, not the receiver's", () => {
		const rates = new DrainRates();
		attempts(rates, "w", 0, 5_000, 10, { queued: false });
		expect(rates.perSecond("w")).toBe(0);
		// Busy spells shorter than a quarter of a second, each ended by an attempt with nothing queued, measure nothing either.
		for (let at = 10_000; at < 12_000; at += 250) {
			attempts(rates, "w", at, at + 190, 10);
			rates.noteAttempt("w", true, false, at + 200);
		}
		expect(rates.perSecond("w")).toBe(0);
	});

	it("measures a busy spell shorter than a second once it lasted a quarter of a second, when the queue runs empty", () => {
		const rates = new DrainRates();
		// A burst drained in 400 ms: 200 successes, the last with nothing behind it.
		attempts(rates, "w", 0, 398, 2);
		rates.noteAttempt("w", true, false, 400);
		expect(rates.perSecond("w")).toBe(500);
		// A failure in such a spell counts as in a whole second: the rate follows it at once.
		attempts(rates, "w", 10_000, 10_390, 10, { succeeded: at => at !== 10_200 });
		rates.noteAttempt("w", true, false, 10_400);
		expect(rates.perSecond("w")).toBe(97.5);
	});

	it("keeps the last rate through an idle spell, lowers it when the receiver slows down for ten measured seconds, and at once when it fails", () => {
		const rates = new DrainRates();
		burst(rates, "w", 0, 1_000, 1);
		expect(rates.perSecond("w")).toBe(1_000);
		// Idle for an hour: nothing is noted, and the rate stays for the next bursts. Nine bursts of
		// one slow second each leave it too; the tenth lowers it.
		for (let slowBurst = 0; slowBurst < 9; slowBurst++) {
			const from = 3_600_000 + slowBurst * 2_000;
			burst(rates, "w", from, from + 1_000, 10);
			expect(rates.perSecond("w")).toBe(1_000);
		}
		burst(rates, "w", 3_618_000, 3_619_000, 10);
		expect(rates.perSecond("w")).toBe(100);
		// Busy, but every other attempt fails: only successes drain the queue, and the failures end the grace.
		burst(rates, "w", 3_620_000, 3_621_000, 10, at => at % 20 === 0);
		expect(rates.perSecond("w")).toBe(50);
		burst(rates, "w", 3_622_000, 3_623_000, 10, () => false);
		expect(rates.perSecond("w")).toBe(0);
	});

	it("does not lower the rate for slow seconds between fast ones, unless an attempt failed in them", () => {
		const rates = new DrainRates();
		attempts(rates, "w", 0, 2_000, 2);
		expect(rates.perSecond("w")).toBe(500);
		// Nine seconds in which the webhook's queue drained at a tenth of that (a burst's intake took the cores), then fast again.
		attempts(rates, "w", 2_050, 11_000, 50);
		expect(rates.perSecond("w")).toBe(500);
		attempts(rates, "w", 11_002, 12_000, 2);
		expect(rates.perSecond("w")).toBe(500);
		// A slow second with one failure in it counts at once.
		attempts(rates, "w", 12_050, 13_000, 50, { succeeded: at => at !== 12_500 });
		expect(rates.perSecond("w")).toBe(19);
	});

	it("forgets a webhook, and past MAX_TRACKED_WEBHOOKS the one measured longest ago", () => {
		const rates = new DrainRates();
		attempts(rates, "w", 0, 1_000, 10);
		expect(rates.perSecond("w")).toBe(100);
		rates.forget("w");
		expect(rates.perSecond("w")).toBe(0);
		for (let i = 0; i <= MAX_TRACKED_WEBHOOKS; i++) {
			rates.noteAttempt(`w${i}`, true, true, 0);
			rates.noteAttempt(`w${i}`, true, true, 1_000);
		}
		expect(rates.perSecond("w0")).toBe(0);
		expect(rates.perSecond("w1")).toBe(1);
		expect(rates.perSecond(`w${MAX_TRACKED_WEBHOOKS}`)).toBe(1);
	});
});
