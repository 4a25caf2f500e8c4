// The cluster as issue 8 describes it, every role its own process over this test's own NATS
// with JetStream and a PostgreSQL schema: a gateway (api, topics, webhooks, users), two
// dispatchers and a notifier. Webhooks are created and email is turned on over HTTP; 1,000
// events come from an outside Moleculer node through the durable channel. Every delivery must
// reach the HTTPS receiver with a valid Standard Webhooks signature, every expected email the
// SMTP server, and nothing may go to the wrong customer or user.
import {
	Cluster,
	describeCluster,
	emailWorthy,
	eventually,
	orderEvents,
	printFigures,
	withClusterLogs,
	type ClusterWebhook,
} from "./helpers/cluster";
import type { TaskingOrderStatusInput } from "../lib/schemas/events";

const EVENTS = 1_000;
const OTHER_CUSTOMER_EVENTS = 50;

describeCluster("cluster: gateway, two dispatchers and a notifier as processes", () => {
	let cluster: Cluster | undefined;

	beforeAll(async () => {
		cluster = await Cluster.start({ label: "integration" });
		await withClusterLogs(cluster, () =>
			cluster!.startRoles(["gateway", "gateway"], ["dispatcher", "dispatcher-1"], ["dispatcher", "dispatcher-2"], ["notifier", "notifier"]),
		);
	}, 120_000);
	afterAll(() => cluster?.close(), 60_000);

	it("delivers 1,000 channel events to every webhook, signed, and every expected email", async () => {
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			const alice = await c.token("alice", { customer: "acme", email: "alice@example.com", name: "Alice" });
			const bob = await c.token("bob", { customer: "acme", email: "bob@example.com", name: "Bob" });
			const carol = await c.token("carol", { customer: "globex", email: "carol@example.com", name: "Carol" });
			await c.optInToEmail(alice);
			// Bob is known (his token was seen) but never turned email on: he gets none.
			expect((await c.request("GET", "/id/v3/user/details", { token: bob })).status).toBe(200);
			const acmeHooks: ClusterWebhook[] = [await c.createWebhook(alice, "acme"), await c.createWebhook(bob, "acme")];
			const globexHook = await c.createWebhook(carol, "globex");

			// As producers send them: some without customer_id (looked up from the user, across
			// processes), some without event_id (the stream position stands in), statuses in any case.
			const acmeEvents = orderEvents(EVENTS, { customer: "acme", users: ["alice", "bob"], prefix: "acme" }).map((event, index) => {
				const shaped: TaskingOrderStatusInput = { ...event, status: index % 3 === 0 ? String(event.status).toUpperCase() : event.status };
				if (index % 10 === 1) delete shaped.customer_id;
				if (index % 10 === 2) delete shaped.event_id;
				return shaped;
			});
			const globexEvents = orderEvents(OTHER_CUSTOMER_EVENTS, { customer: "globex", users: ["carol"], prefix: "globex" });
			const events = [...acmeEvents, ...globexEvents];
			const sent = await c.send(events);
			expect(sent).toBe(events.length);

			const hooks = [...acmeHooks, globexHook];
			await c.waitForDeliveries(acmeHooks, acmeEvents, 180_000);
			await c.waitForDeliveries([globexHook], globexEvents, 60_000);
			const expectedEmails = emailWorthy(events, "alice");
			await c.waitForEmails(expectedEmails, events, 180_000);

			const figures = c.deliveryFigures(hooks, events, sent);
			const emails = c.emailFigures(expectedEmails, events);
			const attemptsByDispatcher = {
				"dispatcher-1": await c.role("dispatcher-1").metric("webhook_delivery_attempts_total"),
				"dispatcher-2": await c.role("dispatcher-2").metric("webhook_delivery_attempts_total"),
			};
			printFigures("integration", { ...figures, emails, attempts_by_dispatcher: attemptsByDispatcher });

			expect(figures).toMatchObject({ expected: 2 * EVENTS + OTHER_CUSTOMER_EVENTS, lost: 0, bad_signatures: 0, wrong_payloads: 0, unexpected: 0, split_deliveries: 0 });
			expect(emails).toMatchObject({ expected: expectedEmails.length, lost: 0, unexpected: 0 });
			// Every event was valid: none may have been recorded as rejected.
			expect(await c.db("delivery_rejected_events").select("reason")).toEqual([]);
			expect(await c.db("email_rejected_events").select("errors")).toEqual([]);
			expect(c.smtp.received.every(mail => mail.envelope.to.join() === "alice@example.com")).toBe(true);
			// Both dispatcher processes took part.
			expect(attemptsByDispatcher["dispatcher-1"]).toBeGreaterThan(0);
			expect(attemptsByDispatcher["dispatcher-2"]).toBeGreaterThan(0);
		});
	}, 300_000);

	// Each dispatcher process keeps a customer's subscribers between intake batches; the gateway's
	// webhooks.* broadcasts must reach both before the next event does.
	it("sends every event sent after a webhook change to the webhooks as changed, on both dispatchers", async () => {
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			const dave = await c.token("dave", { customer: "initech", email: "dave@example.com", name: "Dave" });
			const batch = (name: string) => orderEvents(40, { customer: "initech", users: ["dave"], prefix: `initech-${name}` });
			const deliveryRows = async (webhook: ClusterWebhook) => Number((await c.db("deliveries").where({ webhook_id: webhook.id }).count({ count: "*" }))[0].count);
			const dispatchers = ["dispatcher-1", "dispatcher-2"];
			const attemptsByPhase: Record<string, number[]> = {};
			const attempts = () => Promise.all(dispatchers.map(name => c.role(name).metric("webhook_delivery_attempts_total")));
			/** Sends a batch and waits for it; every dispatcher must have attempted some of it. */
			const sendOnBoth = async (events: TaskingOrderStatusInput[], to: ClusterWebhook[], phase: string) => {
				const before = await attempts();
				await c.send(events);
				await c.waitForDeliveries(to, events);
				// The counters move when results are recorded, a moment after the receiver answered.
				const after = await eventually(attempts, counts => counts.every((count, index) => count > before[index]), `both dispatchers to attempt deliveries ${phase}`).catch(async err => {
					throw new Error(`${(err as Error).message}: attempts ${JSON.stringify(before)} -> ${JSON.stringify(await attempts())}`);
				});
				attemptsByPhase[phase] = after.map((count, index) => count - before[index]);
			};
			const first = await c.createWebhook(dave, "initech");
			// Both dispatchers take part and now hold initech's subscribers.
			const warm = batch("warm");
			await sendOnBoth(warm, [first], "before the changes");

			const second = await c.createWebhook(dave, "initech");
			const afterCreate = batch("created");
			await sendOnBoth(afterCreate, [first, second], "after the create");

			expect((await c.request("PATCH", `/id/v3/webhooks/${second.id}`, { token: dave, body: { active: false } })).status).toBe(200);
			const afterDisable = batch("disabled");
			await sendOnBoth(afterDisable, [first], "after the disable");

			expect((await c.request("DELETE", `/id/v3/webhooks/${first.id}`, { token: dave })).status).toBe(204);
			expect((await c.request("PATCH", `/id/v3/webhooks/${second.id}`, { token: dave, body: { active: true } })).status).toBe(200);
			const afterSwap = batch("swapped");
			await sendOnBoth(afterSwap, [second], "after the delete and re-enable");

			const figures = {
				first: c.deliveryFigures([first], [...warm, ...afterCreate, ...afterDisable]),
				second: c.deliveryFigures([second], [...afterCreate, ...afterSwap]),
			};
			printFigures("subscriber-changes", { ...figures, attempts_by_phase: attemptsByPhase });
			expect(figures.first).toMatchObject({ lost: 0, unexpected: 0, bad_signatures: 0, wrong_payloads: 0 });
			expect(figures.second).toMatchObject({ lost: 0, unexpected: 0, bad_signatures: 0, wrong_payloads: 0 });
			// Nothing was even planned for a webhook while it was not subscribed.
			expect(await deliveryRows(first)).toBe(warm.length + afterCreate.length + afterDisable.length);
			expect(await deliveryRows(second)).toBe(afterCreate.length + afterSwap.length);
		});
	}, 180_000);
});
