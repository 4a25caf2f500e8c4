// Auto-disable with two dispatcher instances (two brokers) on one database: the failure streak
// lives in the database, so a success seen by either instance ends it, and a dead webhook is
// disabled once, with one webhook:disabled notice, whichever instance decides. SQLite and PostgreSQL.
import { startStack, type Stack } from "./helpers/stack";
import { testDatabases } from "./helpers/services";
import { newCustomer, orderEvent, sleep, startDeliveryStack, waitUntil, FAST_DELIVERY_ENV, type DeliveryStack } from "./helpers/delivery-stack";
import { metricsOf } from "../lib/metrics";

// Small capacity, so both instances' poll loops claim retries; a test-sized failure window.
const INSTANCE_ENV = { DELIVERY_CONCURRENCY: "2", DELIVERY_WEBHOOK_CONCURRENCY: "1", WEBHOOK_DISABLE_AFTER: "2s" };

async function attemptsBy(stack: Stack): Promise<number> {
	const metric = metricsOf(stack.app.broker).getSingleMetric("webhook_delivery_attempts_total");
	const { values } = await metric!.get();
	return values.reduce((sum, value) => sum + value.value, 0);
}

describe.each(testDatabases())("auto-disable across two dispatcher instances on %s", database => {
	let first: DeliveryStack;
	let second: Stack;

	beforeAll(async () => {
		first = await startDeliveryStack(database, { env: INSTANCE_ENV });
		second = await startStack({
			services: ["webhooks", "dispatcher"],
			database,
			dataDir: first.stack.dataDir,
			schema: first.stack.schema,
			env: { ...FAST_DELIVERY_ENV, ...INSTANCE_ENV, WEBHOOK_CA_FILE: first.caFile },
		});
	});
	afterAll(async () => {
		await second?.stopServices();
		await second?.db.destroy();
		await first?.stop();
	});

	it("keeps a webhook that succeeds now and then on either instance, and disables a dead one once", async () => {
		const alice = await newCustomer(first.stack);
		const flaky = await first.createWebhook(alice.token);
		const dead = await first.createWebhook(alice.token);
		const watcher = await first.createWebhook(alice.token, { events: ["webhook:disabled"] });
		let flakyCalls = 0;
		first.script(flaky, [], () => ({ status: ++flakyCalls % 4 === 0 ? 200 : 500 }));
		first.script(dead, [], { status: 500 });

		const firstBefore = await attemptsBy(first.stack);
		const secondBefore = await attemptsBy(second);
		for (let i = 0; i < 6; i++) await first.stack.app.broker.call("dispatcher.publish", orderEvent(alice));

		const disabled = await waitUntil(
			async () => (await first.stack.request("GET", `/id/v3/webhooks/${dead.id}`, { token: alice.token })).body,
			body => body.active === false,
			"the dead webhook to be disabled",
		);
		expect(disabled.disabled_reason).toBe("failing");
		await waitUntil(() => first.stack.db("deliveries").where({ webhook_id: flaky.id, status: "pending" }), rows => rows.length === 0, "the flaky webhook's deliveries to finish");
		// Both instances attempted deliveries: the streak really was shared.
		expect(await attemptsBy(first.stack)).toBeGreaterThan(firstBefore);
		expect(await attemptsBy(second)).toBeGreaterThan(secondBefore);
		const flakyNow = (await first.stack.request("GET", `/id/v3/webhooks/${flaky.id}`, { token: alice.token })).body;
		expect(flakyNow).toMatchObject({ active: true, disabled_reason: null });

		await waitUntil(() => first.received(watcher), requests => requests.length >= 1, "the notice");
		await sleep(1_000);
		expect(first.received(watcher)).toHaveLength(1);
		expect(await first.stack.db("deliveries").where({ webhook_id: watcher.id })).toHaveLength(1);
	});
});
