// A stopping service lets go of its database last: every other part first finishes and writes
// what it still holds. Moleculer runs the mixins' stopped hooks in the reverse order of their
// created hooks, so DbMixin must be the last mixin listed; when it was listed first, the
// dispatcher released the database before its health flush ran, and the failure counts noted in
// the last second before a stop were lost ("Could not record webhook failures: Unable to acquire
// a connection"). On SQLite and PostgreSQL.
import type { Service } from "moleculer";
import { releaseServiceDatabase } from "../mixins/db.mixin";
import { testDatabases } from "./helpers/services";
import { newCustomer, orderEvent, startDeliveryStack, waitUntil, type DeliveryStack } from "./helpers/delivery-stack";

type Hook = (...args: unknown[]) => unknown;
/** A service's merged stopped hooks; Moleculer calls them from the end of this list to its start. */
const stoppedHooksOf = (service: Service): Hook[] => {
	const hooks = (service.schema as unknown as { stopped?: Hook | Hook[] }).stopped;
	return hooks === undefined ? [] : Array.isArray(hooks) ? hooks : [hooks];
};

describe.each(testDatabases())("stopping a service on %s", database => {
	let env: DeliveryStack | undefined;
	afterEach(async () => {
		await env?.stop();
		env = undefined;
	});

	it("releases the database after every other stopped hook of every service that owns data", async () => {
		env = await startDeliveryStack(database);
		const owners = env.stack.app.broker.services.filter(service => "db" in service);
		expect(owners.map(service => service.name).sort()).toEqual(["dispatcher", "notifier", "topics", "users", "webhooks"]);
		for (const service of owners) {
			expect({ service: service.name, releasedLast: stoppedHooksOf(service)[0] === releaseServiceDatabase }).toEqual({ service: service.name, releasedLast: true });
		}
	});

	it("writes the failure counts the dispatcher noted just before the stop", async () => {
		env = await startDeliveryStack(database);
		const alice = await newCustomer(env.stack);
		const webhook = await env.createWebhook(alice.token);
		env.script(webhook, [], { status: 500 });
		const event = orderEvent(alice);
		await env.stack.app.broker.call("dispatcher.publish", event);
		// The failed attempt is recorded (its result write lingers 20 ms); the failure count waits
		// for the health flush, up to a second later, or for the stop.
		await waitUntil(() => env!.stack.db("deliveries").where({ event_id: event.event_id, webhook_id: webhook.id }).first(), row => row?.attempt_count === 1, "the failed attempt");
		await env.stack.stopServices();

		const failures = await env.stack.db("webhook_failures").where({ webhook_id: webhook.id });
		expect(failures).toEqual([expect.objectContaining({ webhook_id: webhook.id, failed_messages: 1, failing_since: expect.any(String) })]);
	});
});
