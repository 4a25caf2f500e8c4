// Groups work that arrives close together into one batch, so that e.g. a burst of events is
// written in one database transaction instead of one per event. A batch starts on the next turn
// of the event loop; while it runs, new items wait and form the next batch. So under light load
// an item waits for nothing, and under heavy load batches grow by themselves. Where the batch
// work itself runs on the event loop (SQLite), a saturated loop can also linger a little before a
// batch starts (BusyLinger), so that a burst pays for one commit instead of one per item.
import { performance, type EventLoopUtilization } from "node:perf_hooks";

export type BatchHandler<Item, Result> = (items: Item[]) => Promise<Result[]>;

interface Pending<Item, Result> {
	item: Item;
	resolve(result: Result): void;
	reject(error: unknown): void;
}

/** Linger before a batch only while this thread's event loop has been busier than `utilisation` (0..1). */
export interface BusyLinger {
	utilisation: number;
	lingerMs: number;
	/**
	 * The event loop's utilisation (0..1) since the previous call. By default this thread's own,
	 * from perf_hooks; a test gives a loop whose load it decides, since a loaded machine can make
	 * a sleeping loop read busy.
	 */
	readUtilisation?: () => number;
}

/** This thread's event-loop utilisation since the previous call. */
function threadUtilisation(): () => number {
	let since: EventLoopUtilization = performance.eventLoopUtilization();
	return () => {
		const now = performance.eventLoopUtilization();
		const { utilization } = performance.eventLoopUtilization(now, since);
		since = now;
		return utilization;
	};
}

// How often the event loop's utilisation is sampled for BusyLinger.
const LOOP_SAMPLE_MS = 100;

export class MicroBatcher<Item, Result> {
	private queue: Array<Pending<Item, Result>> = [];
	private running: Promise<void> | null = null;
	private scheduled = false;
	private readonly readUtilisation: () => number;
	private loopSampledAt = performance.now();
	private loopBusy = false;

	/**
	 * @param handle processes one batch and returns one result per item, in order; if it throws,
	 * every item of that batch is rejected with the error.
	 * @param maxBatch the largest batch handed to `handle`.
	 * @param lingerMs how long a batch waits for company before it starts (0: the next turn of
	 * the event loop). Worth a few milliseconds where nobody waits for the result.
	 * @param busyLinger where `lingerMs` is 0: linger only while the event loop is saturated.
	 */
	constructor(
		private readonly handle: BatchHandler<Item, Result>,
		private readonly maxBatch = 500,
		private readonly lingerMs = 0,
		private readonly busyLinger?: BusyLinger,
	) {
		this.readUtilisation = busyLinger?.readUtilisation ?? threadUtilisation();
	}

	get size(): number {
		return this.queue.length;
	}

	add(item: Item): Promise<Result> {
		return new Promise<Result>((resolve, reject) => {
			this.queue.push({ item, resolve, reject });
			this.schedule();
		});
	}

	/**
	 * Hands the items that wait for the next batch to another writer, which must settle each one
	 * (in order) once it has handled them, or fail them all.
	 */
	takeWaiting(): { items: Item[]; settle(results: Result[]): void; fail(error: unknown): void } | null {
		if (this.queue.length === 0) return null;
		const taken = this.queue.splice(0, this.maxBatch);
		return {
			items: taken.map(pending => pending.item),
			settle: results => taken.forEach((pending, index) => pending.resolve(results[index])),
			fail: error => {
				for (const pending of taken) pending.reject(error);
			},
		};
	}

	/** Resolves once every item added so far has been handled. */
	async drain(): Promise<void> {
		while (this.running || this.scheduled || this.queue.length > 0) {
			if (this.running) await this.running;
			else await new Promise(resolve => setImmediate(resolve));
		}
	}

	private schedule(): void {
		if (this.scheduled || this.running) return;
		this.scheduled = true;
		const start = () => {
			this.scheduled = false;
			this.running = this.runBatches().finally(() => {
				this.running = null;
				if (this.queue.length > 0) this.schedule();
			});
		};
		const linger = this.lingerMs > 0 ? this.lingerMs : this.isLoopBusy() ? this.busyLinger!.lingerMs : 0;
		if (linger > 0) setTimeout(start, linger);
		else setImmediate(start);
	}

	/** Whether the event loop was busier than busyLinger.utilisation over the last sample period. */
	private isLoopBusy(): boolean {
		if (!this.busyLinger) return false;
		const now = performance.now();
		if (now - this.loopSampledAt >= LOOP_SAMPLE_MS) {
			this.loopBusy = this.readUtilisation() > this.busyLinger.utilisation;
			this.loopSampledAt = now;
		}
		return this.loopBusy;
	}

	private async runBatches(): Promise<void> {
		for (let batch = this.takeWaiting(); batch; batch = this.takeWaiting()) {
			try {
				batch.settle(await this.handle(batch.items));
			} catch (error) {
				batch.fail(error);
			}
		}
	}
}
