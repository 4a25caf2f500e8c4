// Webhook attempts sent from worker threads, so that the HTTPS work (signing, TLS, undici) uses
// another core than the dispatcher's event loop, which keeps the intake, the claims and the
// result writes. Profiles of a busy dispatcher showed one saturated event loop with the HTTP
// client taking about a third of it while the second core idled.
//
// Same contract as WebhookSender: send() resolves with an outcome and never throws for network
// trouble. Attempts started in one turn of the event loop cross to a thread as one message, and
// outcomes come back the same way. Each URL always goes to the same thread, so that a webhook's
// connections live in one pool. A thread that dies (a bug, never a network failure) rejects the
// attempts it held; their leases expire and they are attempted again, as after a crash. The next
// attempt starts a new thread.
import path from "node:path";
import type { Worker } from "node:worker_threads";
import type { ServiceBroker } from "moleculer";
import { counterReadAtScrape, gaugeReadAtScrape } from "./metrics";
import { startTypeScriptWorker } from "./typescript-worker";
import type { DeliveryOutcome, DeliveryRequest, WebhookSender, WebhookSenderOptions } from "./webhook-sender";

/** An attempt for the thread: its id, the request, and the latest start of a rate-limited one (else null). */
export type ThreadAttempt = [number, DeliveryRequest, number | null];
export type ToSenderThread = { type: "send"; attempts: ThreadAttempt[] } | { type: "loop" } | { type: "close" };
/** An attempt's outcome, or null for a rate-limited one that could not start by its deadline. */
export type ThreadOutcome = [number, DeliveryOutcome | null];
export type FromSenderThread =
	| { type: "ready" }
	| { type: "failed"; message: string }
	| { type: "outcomes"; outcomes: ThreadOutcome[] }
	| { type: "loop"; figures: SenderLoopFigures };

/** A sender thread's event loop since the previous reading. */
export interface SenderLoopFigures {
	delayP99Seconds: number;
	/** The share of the time the loop was busy, 0..1. */
	utilization: number;
	/** Connections the thread has opened since it started (not since the previous reading). */
	connectionsOpened: number;
}

/** What the dispatcher needs of a sender, in-process or threaded. */
export interface DeliverySender {
	send(request: DeliveryRequest): Promise<DeliveryOutcome>;
	/** null when the attempt could not start by `startBy` (epoch ms): nothing was sent. */
	sendBy(request: DeliveryRequest, startBy: number): Promise<DeliveryOutcome | null>;
	close(): Promise<void>;
}

const THREAD_ENTRY = path.join(__dirname, "sender-thread.ts");

interface PendingAttempt {
	resolve(outcome: DeliveryOutcome | null): void;
	reject(error: Error): void;
}

/** One worker thread and the attempts it holds. */
class SenderThread {
	private worker: Worker | null = null;
	private ready: Promise<void> | null = null;
	private readonly pending = new Map<number, PendingAttempt>();
	private outbox: ThreadAttempt[] = [];
	private nextId = 1;
	private closing = false;
	private loopReaders: Array<(figures: SenderLoopFigures | null) => void> = [];

	constructor(private readonly options: WebhookSenderOptions) {}

	/** Starts the thread; rejects with the sender's own error (a bad CA file, say). */
	start(): Promise<void> {
		if (this.ready) return this.ready;
		const worker = startTypeScriptWorker(THREAD_ENTRY, this.options);
		this.worker = worker;
		this.ready = new Promise<void>((resolve, reject) => {
			worker.on("message", (message: FromSenderThread) => {
				if (message.type === "ready") resolve();
				else if (message.type === "failed") reject(new Error(message.message));
				else if (message.type === "outcomes") this.settle(message.outcomes);
				else if (message.type === "loop") this.loopReaders.shift()?.(message.figures);
			});
			worker.once("exit", code => {
				reject(new Error(`sender thread stopped (exit code ${code}) before it was ready`));
				this.lost(code);
			});
			worker.on("error", error => reject(error));
		});
		// An idle thread must not keep the process alive; a starting one must, or awaiting the start
		// could be the last thing the process does. A failed start is reported to whoever awaits
		// start(); the next send starts anew.
		this.ready.then(() => this.pending.size === 0 && worker.unref(), () => undefined);
		return this.ready;
	}

	/** As WebhookSender's sendBy with a `startBy`, else as its send (then never null). */
	send(request: DeliveryRequest, startBy: number | null): Promise<DeliveryOutcome | null> {
		if (this.closing) return Promise.reject(new Error("the sender is closed"));
		void this.start();
		const id = this.nextId++;
		// After this turn's I/O callbacks, not after the current one: each finished result batch
		// or intake batch starts attempts of its own, and at the end of each callback (a microtask)
		// a burst in the cluster sent 9 attempts a message; at the end of the turn, 18.
		if (this.outbox.length === 0) setImmediate(() => this.flush());
		this.outbox.push([id, request, startBy]);
		if (this.pending.size === 0) this.worker!.ref();
		return new Promise((resolve, reject) => this.pending.set(id, { resolve, reject }));
	}

	/** The thread's event-loop figures since the last reading; null while no thread runs. */
	loopFigures(): Promise<SenderLoopFigures | null> {
		if (!this.worker || this.closing) return Promise.resolve(null);
		const worker = this.worker;
		return new Promise(resolve => {
			this.loopReaders.push(resolve);
			worker.postMessage({ type: "loop" } satisfies ToSenderThread);
		});
	}

	/** Lets attempts in flight finish, then ends the thread. */
	async close(): Promise<void> {
		this.closing = true;
		const worker = this.worker;
		if (!worker) return;
		this.flush();
		const exited = new Promise<void>(resolve => worker.once("exit", () => resolve()));
		worker.postMessage({ type: "close" } satisfies ToSenderThread);
		worker.ref();
		await exited;
	}

	private flush(): void {
		if (this.outbox.length === 0 || !this.worker) return;
		this.worker.postMessage({ type: "send", attempts: this.outbox } satisfies ToSenderThread);
		this.outbox = [];
	}

	private settle(outcomes: ThreadOutcome[]): void {
		for (const [id, outcome] of outcomes) {
			this.pending.get(id)?.resolve(outcome);
			this.pending.delete(id);
		}
		if (this.pending.size === 0) this.worker?.unref();
	}

	private lost(code: number): void {
		this.worker = null;
		this.ready = null;
		this.outbox = [];
		for (const reader of this.loopReaders.splice(0)) reader(null);
		const error = new Error(`sender thread stopped (exit code ${code}) with attempts in flight`);
		for (const attempt of this.pending.values()) attempt.reject(error);
		this.pending.clear();
	}
}

export class ThreadedWebhookSender implements DeliverySender {
	private readonly threads: SenderThread[];

	constructor(options: WebhookSenderOptions & { threads: number }) {
		const { threads, ...senderOptions } = options;
		this.threads = Array.from({ length: Math.max(1, threads) }, () => new SenderThread(senderOptions));
	}

	/** Starts every thread; rejects when the sender cannot be built (its options are wrong). */
	async start(): Promise<void> {
		await Promise.all(this.threads.map(thread => thread.start()));
	}

	send(request: DeliveryRequest): Promise<DeliveryOutcome> {
		// Without a deadline the thread always attempts, so the outcome is never null.
		return this.threads[this.threadIndexOf(request.url)].send(request, null) as Promise<DeliveryOutcome>;
	}

	sendBy(request: DeliveryRequest, startBy: number): Promise<DeliveryOutcome | null> {
		return this.threads[this.threadIndexOf(request.url)].send(request, startBy);
	}

	async close(): Promise<void> {
		await Promise.all(this.threads.map(thread => thread.close()));
	}

	/** Each thread's event-loop figures since the last reading (null for a thread not running). */
	loopFigures(): Promise<Array<SenderLoopFigures | null>> {
		return Promise.all(this.threads.map(thread => thread.loopFigures()));
	}

	private threadIndexOf(url: string): number {
		if (this.threads.length === 1) return 0;
		let hash = 0;
		for (let i = 0; i < url.length; i += 1) hash = (hash * 31 + url.charCodeAt(i)) | 0;
		return Math.abs(hash) % this.threads.length;
	}
}

/**
 * The metrics of one scrape share a reading of the sender threads, taken again once it is this old:
 * each reading restarts the threads' loop figures. A scrape may so show a count up to this old.
 */
export const LOOP_READING_MS = 1_000;

const CONNECTIONS_OPENED = "webhook_connections_opened_total";
const CONNECTIONS_OPENED_HELP = "Connections opened to webhook receivers; beside webhook_delivery_attempts_total, whether receivers keep them alive";

/**
 * The sender's metrics, read at scrape time. Connections opened, in either mode. With sender
 * threads also their event loops as gauges labelled by thread index (figures since the previous
 * scrape); the main thread's own are prom-client's nodejs_eventloop_lag_* metrics.
 */
export function publishSenderMetrics(broker: ServiceBroker, sender: ThreadedWebhookSender | WebhookSender): void {
	if (!(sender instanceof ThreadedWebhookSender)) {
		counterReadAtScrape(broker, CONNECTIONS_OPENED, CONNECTIONS_OPENED_HELP, async () => [sender.connectionsOpened]);
		return;
	}
	let reading: { at: number; figures: Promise<Array<SenderLoopFigures | null>> } | undefined;
	const read = () => {
		if (!reading || Date.now() - reading.at >= LOOP_READING_MS) reading = { at: Date.now(), figures: sender.loopFigures() };
		return reading.figures;
	};
	const publish = (name: string, help: string, pick: (figures: SenderLoopFigures) => number) =>
		gaugeReadAtScrape(broker, name, help, ["thread"], async gauge => {
			for (const [index, figures] of (await read()).entries()) if (figures) gauge.set({ thread: String(index) }, pick(figures));
		});
	publish("webhook_sender_event_loop_delay_p99_seconds", "99th percentile of a sender thread's event-loop delay since the last scrape", figures => figures.delayP99Seconds);
	publish("webhook_sender_event_loop_utilization", "Share of the time a sender thread's event loop was busy since the last scrape (0..1)", figures => figures.utilization);
	counterReadAtScrape(broker, CONNECTIONS_OPENED, CONNECTIONS_OPENED_HELP, async () => (await read()).map(figures => figures?.connectionsOpened ?? null));
}
