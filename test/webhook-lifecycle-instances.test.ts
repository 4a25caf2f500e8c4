// Auto-disable with two dispatcher instances (two brokers) on one database: the failure streak
// lives in the database, so a success seen by either instance ends it, and a dead webhook is
// disabled once, with one webhook:disabled notice, whichever instance decides. SQLite and PostgreSQL.
import { testDatabases } from "./helpers/services";
import {
	attemptsMadeBy,
	newCustomer,
	orderEvent,
	sleep,
	useTwoDispatchers,
	waitUntil,
} from "./helpers/delivery-stack";

// Small capacity, so both instances' poll loops claim retries; a test-sized failure window.
const INSTANCE_ENV = { DELIVERY_CONCURRENCY: "2", DELIVERY_WEBHOOK_CONCURRENCY: "1", WEBHOOK_DISABLE_AFTER: "2s" };

describe.each(testDatabases())("auto-disable across two dispatcher instances on %s", database => {
	const instances = useTwoDispatchers(database, INSTANCE_ENV);

	it("keeps a webhook that succeeds now and then on either instance, and disables a dead one once", async () => {
		const { first, second } = instances;
		const alice = await newCustomer(first.stack);
		const flaky = await first.createWebhook(alice.token);
		const dead = await first.createWebhook(alice.token);
		const watcher = await first.createWebhook(alice.token, { events: ["webhook:disabled"] });
		let flakyCalls = 0;
		first.script(flaky, [], () => ({ status: ++flakyCalls % 4 === 0 ? 200 : 500 }));
		first.script(dead, [], { status: 500 });

		// Failed attempts: only the flaky and the dead webhook answer 500 (the watcher's notice
		// succeeds), so each instance's count says it took part in the streaks themselves.
		const failedBy = () => Promise.all([attemptsMadeBy(first.stack.app.broker, "failed"), attemptsMadeBy(second.app.broker, "failed")]);
		const failedBefore = await failedBy();
		for (let i = 0; i < 6; i++) await first.stack.app.broker.call("dispatcher.publish", orderEvent(alice));

		const disabled = await waitUntil(
			async () => (await first.stack.request("GET", `/id/v3/webhooks/${dead.id}`, { token: alice.token })).body,
			body => body.active === false,
			"the dead webhook to be disabled",
		);
		expect(disabled.disabled_reason).toBe("failing");
		await waitUntil(() => first.stack.db("deliveries").where({ webhook_id: flaky.id, status: "pending" }), rows => rows.length === 0, "the flaky webhook's deliveries to finish");
		// Both instances made failing attempts: the streak really was shared.
		const failedAfter = await failedBy();
		const failedByInstance = failedAfter.map((count, index) => count - failedBefore[index]);
		console.info(`[${database}] failed attempts by instance: first ${failedByInstance[0]}, second ${failedByInstance[1]}`);
		expect(failedByInstance[0]).toBeGreaterThan(0);
		expect(failedByInstance[1]).toBeGreaterThan(0);
		const flakyNow = (await first.stack.request("GET", `/id/v3/webhooks/${flaky.id}`, { token: alice.token })).body;
		expect(flakyNow).toMatchObject({ active: true, disabled_reason: null });

		await waitUntil(() => first.received(watcher), requests => requests.length >= 1, "the notice");
		await sleep(1_000);
		expect(first.received(watcher)).toHaveLength(1);
		expect(await first.stack.db("deliveries").where({ webhook_id: watcher.id })).toHaveLength(1);
	});
});
