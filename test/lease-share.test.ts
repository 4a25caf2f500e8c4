// A webhook's share of a dispatcher's leases follows how fast its queue drained while it was busy
// (lib/drain-rates.ts, webhookShare in mixins/dispatcher/worker.mixin.ts). With a real HTTPS
// receiver, on SQLite and PostgreSQL: a webhook that has not been measured is leased its fixed
// share at intake and the rest of a burst waits in the database for claims; one measured fast is
// leased the whole next burst as it is written. Every delivery still arrives once. How the rate
// is measured, kept and lowered: test/dispatcher-units.test.ts.
import { testDatabases } from "./helpers/services";
import { newCustomer, orderEvent, startDeliveryStack, waitUntil, type CreatedWebhook, type DeliveryStack } from "./helpers/delivery-stack";

// One attempt at a time per webhook: the fixed share is 1 x 16 leases.
const FIXED_SHARE = 16;
const BURST = 120;
// Answered after 10 ms each, one at a time: over 2 s of a busy queue, in which its rate is measured.
const FIRST_BURST = 200;

describe.each(testDatabases())("lease shares on %s", database => {
	let env: DeliveryStack;

	beforeAll(async () => {
		env = await startDeliveryStack(database, { env: { DELIVERY_WEBHOOK_CONCURRENCY: "1" } });
	});
	afterAll(() => env?.stop());

	/** A new customer with one webhook, and a way to publish its events (each persisted when answered). */
	const newWebhook = async () => {
		const customer = await newCustomer(env.stack);
		const webhook = await env.createWebhook(customer.token);
		const publish = (count: number) => Promise.all(Array.from({ length: count }, () => env.stack.app.broker.call("dispatcher.publish", orderEvent(customer))));
		return { webhook, publish };
	};
	/** Its deliveries that are not waiting in the database for a claim: leased, or already done. */
	const takenRows = async (webhook: CreatedWebhook, total: number) =>
		total - Number((await env.stack.db("deliveries").where({ webhook_id: webhook.id, status: "pending" }).whereNull("lease_id").count({ n: "*" }))[0].n);
	const succeeded = (webhook: CreatedWebhook) => env.stack.db("deliveries").where({ webhook_id: webhook.id, status: "succeeded" }).count({ n: "*" }).then(rows => Number(rows[0].n));
	const answeredOnce = (webhook: CreatedWebhook) => {
		const ids = env.received(webhook).filter(request => request.answeredStatus === 200).map(request => request.headers["webhook-id"]);
		return { distinct: new Set(ids).size, repeats: ids.length - new Set(ids).size };
	};

	it("leases a webhook measured draining fast more than its fixed share at intake, and an unmeasured one only that", async () => {
		const fast = await newWebhook();
		const fresh = await newWebhook();

		env.script(fast.webhook, [], { status: 200, delayMs: 10 });
		await fast.publish(FIRST_BURST);
		await waitUntil(() => succeeded(fast.webhook), count => count === FIRST_BURST, "the first burst to be delivered");

		// Both receivers now answer after 2 s, one at a time: until the fresh webhook is down to
		// half its share (8 answers, 16 s), no claim takes any of its rows, so what is not waiting in
		// the database right after intake is what intake leased.
		env.script(fast.webhook, [], { status: 200, delayMs: 2_000 });
		env.script(fresh.webhook, [], { status: 200, delayMs: 2_000 });
		await fast.publish(BURST);
		await fresh.publish(BURST);
		const taken = { fast: await takenRows(fast.webhook, FIRST_BURST + BURST) - FIRST_BURST, fresh: await takenRows(fresh.webhook, BURST) };
		console.log(JSON.stringify({ database, leased_at_intake: taken, fixed_share: FIXED_SHARE, burst: BURST }));
		expect(taken.fresh).toBe(FIXED_SHARE);
		expect(taken.fast).toBe(BURST);

		// Answering at once again, both drain: every delivery arrives, none twice.
		env.script(fast.webhook, [], { status: 200 });
		env.script(fresh.webhook, [], { status: 200 });
		await waitUntil(() => succeeded(fast.webhook), count => count === FIRST_BURST + BURST, "the fast webhook's second burst");
		await waitUntil(() => succeeded(fresh.webhook), count => count === BURST, "the fresh webhook's burst");
		for (const { webhook } of [fast, fresh]) {
			const { distinct, repeats } = answeredOnce(webhook);
			console.log(JSON.stringify({ database, webhook: webhook.id, delivered: distinct, repeats }));
			expect(repeats).toBe(0);
		}
		expect(answeredOnce(fast.webhook).distinct).toBe(FIRST_BURST + BURST);
		expect(answeredOnce(fresh.webhook).distinct).toBe(BURST);
	});
});
