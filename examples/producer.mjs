// A Moleculer producer on the durable channel: what another team's service runs to report a
// tasking order's status change to the webhook cluster. It needs, in its own package:
//   npm install moleculer@0.14 @moleculer/channels@0.1.8 nats@2
// and runs as an ES module (top-level await):
//   TRANSPORTER=nats://127.0.0.1:4222 NAMESPACE=local node examples/producer.mjs
import { randomUUID } from "node:crypto";
import moleculer from "moleculer";
import channels from "@moleculer/channels";

const transporter = process.env.TRANSPORTER ?? "nats://127.0.0.1:4222";
// Must equal the webhook cluster's NAMESPACE (`npm run cluster` uses "local"): the channel's
// stream and subjects are named after it, so a producer in another namespace publishes where
// no consumer ever reads.
const namespace = process.env.NAMESPACE ?? "local";

const broker = new moleculer.ServiceBroker({
	namespace,
	nodeID: `order-producer-${process.pid}`,
	transporter,
	logLevel: "warn",
	middlewares: [channels.Middleware({ adapter: { type: "NATS", options: { nats: { url: transporter } } } })],
});

const event = {
	event_id: randomUUID(), // a UUID (anything else is rejected); the key that makes a repeat harmless
	customer_id: "acme", // optional; looked up from user_id when absent ("~alice" for a user who is their own customer)
	user_id: "alice", // the order's owner, who gets the email
	order_id: "o-1",
	status: "fulfilled", // case-insensitive: committed, staged, in progress, fulfilled, failed, rejected, cancelled, expired
	previous_status: "in progress", // optional
	order_name: "Harbour survey", // optional
	occurred_at: new Date().toISOString(), // optional, defaults to now
	details: { aoi: "POLYGON((…))" }, // optional object (up to 16 KiB), passed through into data
};

await broker.start();
try {
	// Resolves once JetStream has stored the event. If it rejects, send it again with the same
	// event_id: a repeat is recognised and skipped.
	await broker.sendToChannel("tasking.order_status", event);
	console.log(`sent ${event.event_id} (order ${event.order_id}: ${event.status}) to ${namespace}.tasking.order_status`);
} finally {
	await broker.stop();
}
