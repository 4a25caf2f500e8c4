// The inside of a sender thread (see lib/threaded-sender.ts): a WebhookSender of its own, fed
// batches of attempts over the parent port and answering with batches of outcomes. Only the
// HTTPS work runs here (signing, TLS, undici); the dispatcher's event loop keeps the database.
import { monitorEventLoopDelay, performance } from "node:perf_hooks";
import { parentPort, workerData } from "node:worker_threads";
import { WebhookSender, type DeliveryOutcome, type WebhookSenderOptions } from "./webhook-sender";
import type { FromSenderThread, SenderLoopFigures, ThreadOutcome, ToSenderThread } from "./threaded-sender";

const port = parentPort;
if (!port) throw new Error("lib/sender-thread.ts runs only inside a worker thread");

let sender: WebhookSender | undefined;
try {
	sender = new WebhookSender(workerData as WebhookSenderOptions);
	post({ type: "ready" });
} catch (error) {
	// Closing the port, rather than exiting, lets this message reach the parent first.
	post({ type: "failed", message: (error as Error).message });
	port.close();
}

// Outcomes that finish in the same turn of the event loop go back as one message.
let finished: ThreadOutcome[] = [];
function reply(id: number, outcome: DeliveryOutcome | null): void {
	if (finished.length === 0) setImmediate(flushOutcomes);
	finished.push([id, outcome]);
}

function flushOutcomes(): void {
	post({ type: "outcomes", outcomes: finished });
	finished = [];
}

function post(message: FromSenderThread): void {
	port!.postMessage(message);
}

// This thread's event loop, as the parent's metrics report it: a saturated loop delays every
// attempt it holds, and the main thread's own figures do not show it. 10 ms, as prom-client's
// lag metrics of the main thread sample.
const loopDelay = monitorEventLoopDelay({ resolution: 10 });
loopDelay.enable();
let loopSince = performance.eventLoopUtilization();

/** The event loop's delay and utilisation since the last call, and the connections opened so far. */
function loopFigures(sender: WebhookSender): SenderLoopFigures {
	const now = performance.eventLoopUtilization();
	const seconds = (ns: number) => (loopDelay.count > 0 ? ns / 1e9 : 0);
	const figures = {
		delayP99Seconds: seconds(loopDelay.percentile(99)),
		utilization: performance.eventLoopUtilization(now, loopSince).utilization,
		connectionsOpened: sender.connectionsOpened,
	};
	loopDelay.reset();
	loopSince = now;
	return figures;
}

if (sender) port.on("message", (message: ToSenderThread) => receive(sender!, message));

function receive(sender: WebhookSender, message: ToSenderThread): void {
	if (message.type === "send") {
		for (const [id, request, startBy] of message.attempts) {
			// A rate-limited attempt's deadline is checked here, where it starts: the hand-over from
			// the main thread may have waited for a core past its send time.
			void (startBy === null ? sender.send(request) : sender.sendBy(request, startBy)).then(outcome => reply(id, outcome));
		}
	} else if (message.type === "loop") {
		post({ type: "loop", figures: loopFigures(sender) });
	} else if (message.type === "close") {
		void sender.close().then(() => {
			if (finished.length > 0) flushOutcomes();
			// The parent waits for this thread's exit, which closing the port brings.
			port!.close();
		});
	}
}
