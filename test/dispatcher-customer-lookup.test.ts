// An event without customer_id makes the dispatcher ask the users service whose it is. Only
// "no such user" makes the event invalid. When the users service cannot be reached (a cluster
// node that has not discovered the gateway yet, or a gateway that is down), moleculer answers
// with ServiceNotFoundError, whose code is also 404: the cluster integration test saw valid
// events recorded as rejected ("unknown user") for that, and their deliveries lost. Such an
// event must stay retryable and leave no rejection behind.
import crypto from "node:crypto";
import { startStack, type Stack } from "./helpers/stack";
import { testDatabases } from "./helpers/services";

describe.each(testDatabases())("dispatcher customer lookup on %s", database => {
	let alone: Stack;

	beforeAll(async () => {
		// A dispatcher with no users service anywhere.
		alone = await startStack({ database, services: ["dispatcher"] });
	});
	afterAll(() => alone?.stop());

	const event = () => ({ event_id: crypto.randomUUID(), user_id: "alice", order_id: `o-${crypto.randomBytes(3).toString("hex")}`, status: "fulfilled" });

	it("fails as a dependency failure, and rejects nothing, while the users service is unreachable", async () => {
		const sent = event();
		await expect(alone.app.broker.call("dispatcher.publish", sent)).rejects.toMatchObject({ name: "ServiceNotFoundError" });
		expect(await alone.db("delivery_rejected_events").select()).toEqual([]);
		expect(await alone.db("delivery_messages").where({ event_id: sent.event_id }).select()).toEqual([]);
	});

	it("still rejects an event whose user the users service does not know", async () => {
		const stack = await startStack({ database, services: ["users", "dispatcher"] });
		try {
			const sent = event();
			await expect(stack.app.broker.call("dispatcher.publish", sent)).rejects.toMatchObject({ code: 422 });
			const rejected = await stack.db("delivery_rejected_events").select("event_id", "reason");
			expect(rejected).toEqual([{ event_id: sent.event_id, reason: 'user_id: unknown user "alice" and no customer_id given' }]);
		} finally {
			await stack.stop();
		}
	});
});
