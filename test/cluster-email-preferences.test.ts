// The notifier's preference cache across processes: a gateway (api, topics, webhooks, users) and
// a notifier, over this test's own NATS and a PostgreSQL schema, events from an outside node
// through the durable channel. The users service's announcement travels over NATS and drops the
// notifier's cached "off" at once; with the gateway down, the notifier queues the email rather
// than lose it, and sends it once the gateway is back.
import crypto from "node:crypto";
import { Cluster, describeCluster, eventually, withClusterLogs } from "./helpers/cluster";
import type { TaskingOrderStatusInput } from "../lib/schemas/events";

describeCluster("cluster: the notifier's email preference cache", () => {
	let cluster: Cluster | undefined;

	beforeAll(async () => {
		cluster = await Cluster.start({ label: "email-prefs" });
		await withClusterLogs(cluster, async () => {
			await cluster!.startRoles(["gateway", "gateway"], ["notifier", "notifier"]);
			// Until the notifier has discovered the users service it queues every email (the second
			// test shows that); an unknown user's event counted as not queued shows it has.
			await eventually(
				async () => {
					await cluster!.send([fulfilled("nobody")]);
					return notQueued();
				},
				count => count > 0,
				"the notifier to reach the users service",
			);
		});
	}, 120_000);
	afterAll(() => cluster?.close(), 60_000);

	const fulfilled = (user: string): TaskingOrderStatusInput => ({
		event_id: crypto.randomUUID(),
		customer_id: "acme",
		user_id: user,
		order_id: `ord-${crypto.randomBytes(4).toString("hex")}`,
		status: "fulfilled",
	});
	const rowsOf = (event: TaskingOrderStatusInput): Promise<Array<{ status: string }>> => cluster!.db("email_outbox").where({ event_id: event.event_id }).select("status");
	const notQueued = () => cluster!.role("notifier").metric("emails_not_queued_total");
	const mailsTo = (address: string) => cluster!.smtp.received.filter(mail => mail.envelope.to.includes(address));

	/** Sends the event and waits until the notifier either queued it or counted it as not queued. */
	async function handled(event: TaskingOrderStatusInput): Promise<Array<{ status: string }>> {
		const before = await notQueued();
		await cluster!.send([event]);
		await eventually(async () => (await rowsOf(event)).length > 0 || (await notQueued()) > before, done => done, "the notifier to handle the event");
		return rowsOf(event);
	}

	it("queues nothing for a user with email off, and the next event after they turn it on", async () => {
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			const token = await c.token("quinn", { customer: "acme", email: "quinn@example.com" });
			expect((await c.request("GET", "/id/v3/user/details", { token })).status).toBe(200);
			expect(await handled(fulfilled("quinn"))).toEqual([]);

			// The cached "off" (kept up to 30 s) is dropped by users.emailPreferenceChanged over NATS.
			await c.optInToEmail(token);
			const wanted = fulfilled("quinn");
			expect(await handled(wanted)).toHaveLength(1);
			await c.smtp.waitForMessages(1, mail => mail.envelope.to.includes("quinn@example.com"), 60_000);
			expect(mailsTo("quinn@example.com")).toHaveLength(1);
		});
	});

	it("queues the email while the users service is down, and sends it once it is back", async () => {
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			const token = await c.token("pat", { customer: "acme", email: "pat@example.com" });
			await c.optInToEmail(token);
			await c.gateway.terminate();
			const event = fulfilled("pat");
			await c.send([event]);
			const [row] = await eventually(() => rowsOf(event), rows => rows.length === 1, "the email queued while users is down");
			expect(row.status).toBe("pending");
			expect(mailsTo("pat@example.com")).toEqual([]);
			await c.restart("gateway");
			await c.smtp.waitForMessages(1, mail => mail.envelope.to.includes("pat@example.com"), 60_000);
			await eventually(() => rowsOf(event), rows => rows[0]?.status === "sent", "the email marked sent");
		});
	});
});
