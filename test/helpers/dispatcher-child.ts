// A service process for the dispatcher crash test, run from the run's transpiled copy
// (service-build.ts): the real app (createApp, configuration from the environment), optionally
// creating a webhook and publishing events through the acknowledged intake. It reports on
// stdout, one JSON object per line.
//   CHILD_WEBHOOK_URL  create a webhook to this URL for customer "crash", then publish
//   CHILD_PUBLISH      how many events to publish (default 0)
import { loadConfig } from "../../lib/config";
import { createApp } from "../../app";

const say = (message: object) => process.stdout.write(`${JSON.stringify(message)}\n`);

async function main(): Promise<void> {
	const { config } = loadConfig(process.env);
	const app = createApp(config, { broker: { logger: false } });
	process.on("SIGTERM", () => {
		void app.stop().then(() => process.exit(0));
	});
	await app.start();
	say({ started: true });

	const url = process.env.CHILD_WEBHOOK_URL;
	if (!url) return;
	const webhook: { id: string; secret: string } = await app.broker.call(
		"webhooks.create",
		{ name: "crash test", url, events: ["tasking:order_status"] },
		{ meta: { customerId: "crash" } },
	);
	say({ webhook: { id: webhook.id, secret: webhook.secret } });
	const count = Number(process.env.CHILD_PUBLISH ?? 0);
	const publishes = [];
	for (let i = 0; i < count; i++) {
		publishes.push(app.broker.call("dispatcher.publish", { customer_id: "crash", user_id: "crash-user", order_id: `order-${i}`, status: "in progress" }));
	}
	await Promise.all(publishes);
	say({ published: count });
}

main().catch(err => {
	process.stderr.write(`child failed: ${err instanceof Error ? err.stack : String(err)}\n`);
	process.exit(1);
});
