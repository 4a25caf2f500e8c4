// The inside of a sender thread (see lib/threaded-sender.ts): a WebhookSender of its own, fed
// batches of attempts over the parent port and answering with batches of outcomes. Only the
// HTTPS work runs here (signing, TLS, undici); the dispatcher's event loop keeps the database.
import { parentPort, workerData } from "node:worker_threads";
import { WebhookSender, type DeliveryOutcome, type WebhookSenderOptions } from "./webhook-sender";
import type { FromSenderThread, ToSenderThread } from "./threaded-sender";

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
let finished: Array<[number, DeliveryOutcome]> = [];
function reply(id: number, outcome: DeliveryOutcome): void {
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

if (sender) port.on("message", (message: ToSenderThread) => receive(sender!, message));

function receive(sender: WebhookSender, message: ToSenderThread): void {
	if (message.type === "send") {
		for (const [id, request] of message.attempts) void sender.send(request).then(outcome => reply(id, outcome));
	} else if (message.type === "close") {
		void sender.close().then(() => {
			if (finished.length > 0) flushOutcomes();
			// The parent waits for this thread's exit, which closing the port brings.
			port!.close();
		});
	}
}
