// The parent's side of the receivers' child process (bench/lib/receiver.ts): its counts as they
// arrive, waits on them, and its latency samples.
import type { ChildServer } from "./child";
import type { ReceiverMessage, ReceiverReady } from "./receiver";

/** The receivers' child process, and what it reports. */
export class Receivers {
	/** Distinct message ids answered 200 by "ok" endpoints, since the start. */
	ok = 0;
	/** Further requests for a message id an "ok" endpoint had already answered. */
	repeats = 0;
	/** HTTP request bytes (not TLS) of those "ok" answers, since the start. */
	okBytes = 0;
	slow = 0;
	fail = 0;
	/** Requests to `/quiet` paths, answered 200 at once and counted only here. */
	quiet = 0;
	/** "ordered" endpoints: statuses that arrived after a later status of their order. */
	outOfOrder = 0;
	/** TLS connections accepted by any endpoint, since the start. */
	connections = 0;
	private waiters: Array<{ count: number; resolve(): void }> = [];
	private sampleRequests: Array<(samples: Array<[number, number]>) => void> = [];

	constructor(readonly child: ChildServer<ReceiverReady>) {
		child.process.on("message", (message: ReceiverMessage) => {
			if (message.type === "count") {
				({ ok: this.ok, repeats: this.repeats, slow: this.slow, fail: this.fail, quiet: this.quiet, okBytes: this.okBytes, outOfOrder: this.outOfOrder, connections: this.connections } = message);
				const waiting = this.waiters;
				this.waiters = waiting.filter(waiter => waiter.count > this.ok);
				for (const waiter of waiting) if (waiter.count <= this.ok) waiter.resolve();
			} else if (message.type === "samples") {
				this.sampleRequests.shift()?.(message.samples);
			}
		});
	}

	get ports(): number[] {
		return this.child.ready.ports;
	}

	/** Resolves once `count` distinct messages to "ok" endpoints have been answered (since the start); with `boundMs`, rejects past it. */
	waitForOk(count: number, boundMs?: number): Promise<void> {
		if (this.ok >= count) return Promise.resolve();
		return new Promise((resolve, reject) => {
			const timer = boundMs === undefined ? undefined : setTimeout(() => reject(new Error(`the receivers counted ${this.ok} messages, not ${count}, within ${boundMs} ms`)), boundMs);
			this.waiters.push({
				count,
				resolve: () => {
					clearTimeout(timer);
					resolve();
				},
			});
		});
	}

	/**
	 * Whether `count` messages were answered within `boundMs`. The bound only turns a stall into an
	 * invalid run, and its timer is cleared once drained: a bare sleep racing the wait kept
	 * `npm run bench` alive for that long after its last run.
	 */
	drainedWithin(count: number, boundMs: number): Promise<boolean> {
		return this.waitForOk(count, boundMs).then(
			() => true,
			() => false,
		);
	}

	/** [sent_at, latency ms] of the requests that arrived since the last call. */
	samples(): Promise<Array<[number, number]>> {
		return new Promise(resolve => {
			this.sampleRequests.push(resolve);
			this.child.process.send("samples");
		});
	}

	stop(): Promise<void> {
		return this.child.stop();
	}
}
