// Webhooks of several customers on one host (one origin: an API gateway, an integration service).
// One customer's endpoint holds every attempt it gets without answering; the other customers'
// deliveries to the same host must still go out, each webhook limited only by its own
// DELIVERY_WEBHOOK_CONCURRENCY. Before DELIVERY_ORIGIN_CONNECTIONS, the sender's pool for the
// origin had DELIVERY_WEBHOOK_CONCURRENCY connections in all, so the held webhook took every one
// and the others queued behind it until its attempts timed out.
import { testDatabases } from "./helpers/services";
import { newCustomer, orderEvent, startDeliveryStack, verified, waitUntil, type CreatedWebhook, type DeliveryStack } from "./helpers/delivery-stack";

describe.each(testDatabases())("webhooks of several customers on one host, on %s", database => {
	let env: DeliveryStack;
	const WEBHOOK_CONCURRENCY = 2;
	let releaseHeld: () => void = () => {};
	const held = new Promise<void>(resolve => (releaseHeld = resolve));

	beforeAll(async () => {
		env = await startDeliveryStack(database, { env: { DELIVERY_WEBHOOK_CONCURRENCY: String(WEBHOOK_CONCURRENCY), DELIVERY_TIMEOUT: "50s", DELIVERY_LEASE: "60s" } });
	});
	afterAll(async () => {
		releaseHeld();
		await env?.stop();
	});

	const attemptsOf = async (webhook: CreatedWebhook) => Number((await env.stack.db("delivery_attempt_log").join("deliveries", "deliveries.id", "delivery_attempt_log.delivery_id").where("deliveries.webhook_id", webhook.id).count({ n: "*" }))[0].n);

	it("lets the other customers' webhooks deliver while one customer's endpoint holds its attempts", async () => {
		const slowCustomer = await newCustomer(env.stack);
		const slow = await env.createWebhook(slowCustomer.token, { name: "slow" });
		// Every attempt to the slow webhook waits until the test lets it answer.
		env.script(slow, [], () => held.then(() => ({ status: 200, body: "ok" })));

		const others = await Promise.all(
			[1, 2, 3].map(async () => {
				const customer = await newCustomer(env.stack);
				return { customer, webhooks: [await env.createWebhook(customer.token), await env.createWebhook(customer.token)] };
			}),
		);
		const publish = (event: unknown) => env.stack.app.broker.call("dispatcher.publish", event);

		const slowEvents = Array.from({ length: 6 }, () => orderEvent(slowCustomer));
		for (const event of slowEvents) await publish(event);
		await waitUntil(() => env.received(slow).length, n => n === WEBHOOK_CONCURRENCY, "the slow webhook's attempts to be held");

		const EVENTS_EACH = 5;
		const sent = new Set<string>();
		for (const { customer } of others) {
			for (let i = 0; i < EVENTS_EACH; i++) {
				const event = orderEvent(customer);
				sent.add(event.order_id as string);
				await publish(event);
			}
		}
		const otherWebhooks = others.flatMap(other => other.webhooks);
		await waitUntil(() => otherWebhooks.reduce((n, webhook) => n + env.received(webhook).length, 0), n => n >= otherWebhooks.length * EVENTS_EACH, "the other customers' deliveries");

		// They arrived while the slow webhook's first attempts were still unanswered: none of its
		// attempts had ended (an attempt row is written when one does) and it got no further one.
		expect(await attemptsOf(slow)).toBe(0);
		expect(env.received(slow)).toHaveLength(WEBHOOK_CONCURRENCY);
		expect(env.received(slow).every(request => request.answeredStatus === undefined)).toBe(true);

		let repeats = 0;
		for (const { webhooks } of others) {
			for (const webhook of webhooks) {
				const ids = env.received(webhook).map(request => verified(request, webhook.secret).data.order_id as string);
				repeats += ids.length - new Set(ids).size;
				expect(new Set(ids).size).toBe(EVENTS_EACH);
				expect(ids.every(id => sent.has(id))).toBe(true);
			}
		}

		// Then the slow endpoint answers, and all of its deliveries arrive too: nothing is lost.
		releaseHeld();
		await waitUntil(() => new Set(env.received(slow).map(request => verified(request, slow.secret).data.order_id)).size, n => n === slowEvents.length, "the slow webhook's deliveries");
		const slowIds = new Set(env.received(slow).map(request => verified(request, slow.secret).data.order_id as string));
		expect([...slowIds].sort()).toEqual(slowEvents.map(event => event.order_id as string).sort());
		repeats += env.received(slow).length - slowIds.size;
		console.log(`shared host on ${database}: ${otherWebhooks.length * EVENTS_EACH + slowEvents.length} deliveries, 0 lost, ${repeats} repeats`);
	});
});
