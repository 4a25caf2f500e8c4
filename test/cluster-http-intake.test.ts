// The HTTP intake in a cluster (gateway, dispatchers and notifier as real processes, their own
// NATS with JetStream): a 202 means JetStream has stored the events, so that NATS down gets 503
// with nothing stored, and a dispatcher SIGKILLed while 1,000 events are posted loses none.
// Deliveries are counted at a real HTTPS receiver, emails at a real SMTP server; the figures are
// printed as one JSON line per test. The embedded mode is http-intake.test.ts.
import { setTimeout as sleep } from "node:timers/promises";
import {
	Cluster,
	describeCluster,
	emailWorthy,
	eventually,
	orderEvents,
	printFigures,
	withClusterLogs,
	type ClusterWebhook,
	type HttpAnswer,
} from "./helpers/cluster";
import type { TaskingOrderStatusInput } from "../lib/schemas/events";

const INTAKE = "/id/v3/events/tasking.order_status";
const CUSTOMER = "intake-co";

interface Tenant {
	producer: string;
	webhook: ClusterWebhook;
}

/** A producer token, and a customer with one webhook and one user (ada) who turned email on. */
async function tenant(cluster: Cluster): Promise<Tenant> {
	const token = await cluster.token("ada", { customer: CUSTOMER, email: "ada@example.com", name: "Ada" });
	await cluster.optInToEmail(token);
	const webhook = await cluster.createWebhook(token, CUSTOMER);
	return { producer: await cluster.token("orders-service", { scope: "events:publish" }), webhook };
}

const events = (count: number, prefix: string): TaskingOrderStatusInput[] => orderEvents(count, { customer: CUSTOMER, users: ["ada"], prefix });

async function storedRows(cluster: Cluster, ids: string[]): Promise<Record<string, number>> {
	const count = async (table: string) => (await cluster.db(table).whereIn("event_id", ids)).length;
	return { delivery_messages: await count("delivery_messages"), email_outbox: await count("email_outbox") };
}

describeCluster("HTTP intake in a cluster", () => {
	let cluster: Cluster | undefined;
	afterEach(async () => {
		await cluster?.close();
		cluster = undefined;
	}, 60_000);

	it("answers 202 once JetStream has the events, delivers and emails them; NATS down gets 503 and nothing is stored", async () => {
		cluster = await Cluster.start({ label: "http-intake" });
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			await c.startRoles(["gateway", "gateway"], ["dispatcher", "dispatcher"], ["notifier", "notifier"]);
			const { producer, webhook } = await tenant(c);

			const customerToken = await c.token("ada", { customer: CUSTOMER });
			const forbidden = await c.request("POST", INTAKE, { token: customerToken, body: events(1, "forbidden") });
			expect(forbidden.status).toBe(403);

			const first = events(16, "http-first");
			const accepted = await c.request("POST", INTAKE, { token: producer, body: first });
			expect({ status: accepted.status, body: accepted.body }).toEqual({ status: 202, body: { event_ids: first.map(event => event.event_id) } });
			// Stored by JetStream before the answer: the stream holds them whatever the consumers do.
			expect(await c.streamMessages()).toBe(first.length);
			await c.waitForDeliveries([webhook], first);
			await c.waitForEmails(emailWorthy(first, "ada"), first);

			// NATS gone: refused, and nothing reaches JetStream or the tables, even once it is back.
			await c.nats.stop("SIGKILL");
			const during = events(8, "http-during");
			const refused = await c.request("POST", INTAKE, { token: producer, body: during });
			expect({ status: refused.status, type: refused.body?.type, detail: refused.body?.detail }).toEqual({
				status: 503,
				type: "urn:problem:service-unavailable",
				detail: expect.stringContaining("Nothing was stored"),
			});
			await c.nats.start();
			for (const role of c.roles.values()) await eventually(() => role.health(), health => health?.status === 200, `${role.name} to recover`);
			expect(await c.streamMessages()).toBe(first.length);
			expect(await storedRows(c, during.map(event => event.event_id!))).toEqual({ delivery_messages: 0, email_outbox: 0 });

			// The same request once NATS is back: stored, delivered and emailed once.
			const again = await eventually(
				() => c.request("POST", INTAKE, { token: producer, body: during }),
				answer => answer.status !== 503,
				"the intake to accept again",
			);
			expect(again.status).toBe(202);
			const all = [...first, ...during];
			await c.waitForDeliveries([webhook], all);
			await c.waitForEmails(emailWorthy(all, "ada"), all);
			const figures = c.deliveryFigures([webhook], all);
			const emails = c.emailFigures(emailWorthy(all, "ada"), all);
			printFigures("http intake: NATS down", { ...figures, emails, stream_messages: await c.streamMessages() });
			expect(figures).toMatchObject({ lost: 0, repeats: 0, bad_signatures: 0, unexpected: 0, split_deliveries: 0 });
			expect(emails).toMatchObject({ lost: 0, repeats: 0, unexpected: 0 });
		});
	}, 240_000);

	it("1,000 events posted while a dispatcher is SIGKILLed are all delivered", async () => {
		cluster = await Cluster.start({ label: "http-intake-kill", respond: { status: 200, delayMs: 20 } });
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			await c.startRoles(["gateway", "gateway"], ["dispatcher", "dispatcher-1"], ["dispatcher", "dispatcher-2"], ["notifier", "notifier"]);
			const { producer, webhook } = await tenant(c);
			const batch = events(1_000, "http-kill");
			const lists = Array.from({ length: 20 }, (_, index) => batch.slice(index * 50, index * 50 + 50));

			// Two posters, paced, so that the kill lands while events still come in and go out.
			const answers: HttpAnswer[] = [];
			let next = 0;
			let posted = 0;
			const poster = async () => {
				while (next < lists.length) {
					const list = lists[next++];
					answers.push(await c.request("POST", INTAKE, { token: producer, body: list }));
					posted += list.length;
					await sleep(300);
				}
			};
			const posting = Promise.all([poster(), poster()]);
			await eventually(() => c.deliveredCount([webhook]), count => count >= 60, "the first deliveries");
			const exit = await c.role("dispatcher-1").kill("SIGKILL");
			expect(exit.signal).toBe("SIGKILL");
			const postedAtKill = posted;
			const deliveredAtKill = c.deliveredCount([webhook]);
			await posting;

			// The gateway never needed a dispatcher to answer: every list was stored.
			expect(answers.map(answer => answer.status)).toEqual(lists.map(() => 202));
			expect(answers.flatMap(answer => answer.body.event_ids).sort()).toEqual(batch.map(event => event.event_id).sort());
			await c.waitForDeliveries([webhook], batch, 180_000);
			const expectedEmails = emailWorthy(batch, "ada");
			await c.waitForEmails(expectedEmails, batch, 180_000);

			const figures = c.deliveryFigures([webhook], batch, posted);
			const emails = c.emailFigures(expectedEmails, batch);
			printFigures("http intake: SIGKILL a dispatcher", { ...figures, posted_at_kill: postedAtKill, delivered_at_kill: deliveredAtKill, emails });
			expect(figures).toMatchObject({ sent: 1_000, lost: 0, bad_signatures: 0, unexpected: 0, split_deliveries: 0 });
			expect(emails).toMatchObject({ lost: 0, unexpected: 0 });
		});
	}, 300_000);
});
