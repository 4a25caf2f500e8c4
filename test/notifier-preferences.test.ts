// The notifier decides at intake, from its cache of users' email preferences, whether an event is
// worth an outbox row: a user who does not want the email costs no row and no send. The cache is
// dropped by the users service's announcement, so a user who turns email on gets the very next
// email (the cache's expiry is 30 s; these tests take far less). The send-time check stays, and a
// users service that cannot answer at intake leaves the row written, as before the cache.
// Embedded (one broker), on SQLite and PostgreSQL; test/cluster-email-preferences.test.ts runs
// the announcement over NATS.
import crypto from "node:crypto";
import type { ServiceSchema } from "moleculer";
import type { Stack } from "./helpers/stack";
import { testDatabases } from "./helpers/services";
import type { TestSmtpServer } from "./helpers/smtp-server";
import { setOrderStatusEmail, signIn as signInAs, useNotifierStack } from "./helpers/notifier-stack";
import { metricTotal, waitUntil } from "./helpers/delivery-stack";
import type { OutboxEntry } from "../services/notifier.service";
import UsersService from "../services/users.service";

describe.each(testDatabases())("email preferences at intake on %s", database => {
	// One send at a time: an email held at the SMTP server keeps the next one waiting in the outbox.
	const env = useNotifierStack(database, { MAIL_CONCURRENCY: "1", MAIL_POLL_INTERVAL: "100ms", MAIL_RETRY_SCHEDULE: "300ms,600ms,900ms" });
	let stack: Stack;
	let smtp: TestSmtpServer;
	beforeAll(() => {
		({ stack, smtp } = env);
	});

	const userId = (name: string) => `${name}-${crypto.randomBytes(3).toString("hex")}`;
	const signIn = (user: string, email: string | undefined) => signInAs(stack, user, { customer: "acme", ...(email ? { email } : {}) });
	const setEmail = (token: string, email: boolean) => setOrderStatusEmail(stack, token, email);

	/** Embedded, emit returns once the notifier's handler is done with the event. */
	async function emitFor(user: string): Promise<string> {
		const eventId = crypto.randomUUID();
		await stack.app.broker.emit("tasking.order_status", { event_id: eventId, user_id: user, customer_id: "acme", order_id: `ord-${crypto.randomBytes(4).toString("hex")}`, status: "fulfilled" });
		return eventId;
	}

	const rowsOf = (eventId: string): Promise<Array<{ status: string }>> => stack.db("email_outbox").where({ event_id: eventId }).select("status");

	async function settled(eventId: string): Promise<OutboxEntry> {
		const entry = await waitUntil(
			async () => ((await stack.app.broker.call("notifier.outbox", { limit: 500 })) as OutboxEntry[]).find(row => row.event_id === eventId),
			found => found !== undefined && found.status !== "pending",
			`the outbox row of ${eventId} to settle`,
		);
		return entry!;
	}

	const notQueued = (reason: string) => metricTotal(stack.app.broker, "emails_not_queued_total", { reason });

	const mailsTo = (address: string) => smtp.received.filter(mail => mail.envelope.to.includes(address));

	it("writes nothing for a user with email off, and emails the very next event once they turn it on", async () => {
		const quiet = userId("quiet");
		const token = await signIn(quiet, `${quiet}@example.com`);
		const before = await notQueued("email_off");
		const unwanted = [await emitFor(quiet), await emitFor(quiet)];
		for (const eventId of unwanted) expect(await rowsOf(eventId)).toEqual([]);
		expect(await notQueued("email_off")).toBe(before + 2);

		// The cached "off" is dropped by the announcement, not by time.
		await setEmail(token, true);
		const wanted = await emitFor(quiet);
		expect(await settled(wanted)).toMatchObject({ status: "sent", recipient: `${quiet}@example.com` });
		expect(mailsTo(`${quiet}@example.com`)).toHaveLength(1);
		for (const eventId of unwanted) expect(await rowsOf(eventId)).toEqual([]);
	});

	it("writes nothing for a user unknown to users, or without an address until a token brings one", async () => {
		const stranger = userId("stranger");
		const before = await notQueued("email_off");
		expect(await rowsOf(await emitFor(stranger))).toEqual([]);
		expect(await notQueued("email_off")).toBe(before + 1);

		const nameless = userId("nameless");
		await setEmail(await signIn(nameless, undefined), true);
		const withoutAddress = await notQueued("no_address");
		expect(await rowsOf(await emitFor(nameless))).toEqual([]);
		expect(await notQueued("no_address")).toBe(withoutAddress + 1);
		// A request with a token that has an address stores it (users.touch), which is announced.
		await signIn(nameless, `${nameless}@example.com`);
		expect(await settled(await emitFor(nameless))).toMatchObject({ status: "sent", recipient: `${nameless}@example.com` });
	});

	it("still skips at send time a user who turned email off after the event was queued", async () => {
		const holder = userId("holder");
		await setEmail(await signIn(holder, `${holder}@example.com`), true);
		const late = userId("late");
		const lateToken = await signIn(late, `${late}@example.com`);
		await setEmail(lateToken, true);

		smtp.setHold(true);
		try {
			// The only send slot is taken by the holder's email, which the SMTP server holds…
			const held = await emitFor(holder);
			await waitUntil(() => smtp.heldCount(), count => count === 1, "the holder's email held at the SMTP server");
			// …so the late user's email is queued and waits for the worker.
			const queued = await emitFor(late);
			expect(await rowsOf(queued)).toEqual([{ status: "pending" }]);
			await setEmail(lateToken, false);
			smtp.setHold(false);
			smtp.releaseHeld();
			expect((await settled(held)).status).toBe("sent");
			expect(await settled(queued)).toMatchObject({ status: "skipped", last_error: "email notifications are off for this user" });
			expect(mailsTo(`${late}@example.com`)).toEqual([]);
		} finally {
			smtp.setHold(false);
			smtp.releaseHeld();
		}
	});

	it("writes the row when the users service cannot answer at intake, and the worker decides once users is back", async () => {
		const patient = userId("patient");
		await setEmail(await signIn(patient, `${patient}@example.com`), true);
		const quiet = userId("quiet-in-outage");
		await signIn(quiet, `${quiet}@example.com`);
		const broker = stack.app.broker;
		await broker.destroyService(broker.getLocalService("users")!);
		let wanted: string;
		let unknowable: string;
		try {
			wanted = await emitFor(patient);
			// Intake cannot tell that this user has email off: it queues the email rather than risk losing one.
			unknowable = await emitFor(quiet);
			expect(await rowsOf(wanted)).toEqual([{ status: "pending" }]);
			expect(await rowsOf(unknowable)).toEqual([{ status: "pending" }]);
			await waitUntil(
				async () => ((await broker.call("notifier.outbox", { limit: 500 })) as OutboxEntry[]).find(row => row.event_id === wanted),
				row => Boolean(row?.last_error?.startsWith("the users service did not answer")),
				"the worker to find the users service away",
			);
		} finally {
			broker.createService(UsersService as ServiceSchema);
			await broker.waitForServices(["users"], 10_000);
		}
		expect(await settled(wanted)).toMatchObject({ status: "sent", recipient: `${patient}@example.com` });
		expect(await settled(unknowable)).toMatchObject({ status: "skipped", last_error: "email notifications are off for this user" });
		expect(mailsTo(`${patient}@example.com`)).toHaveLength(1);
		expect(mailsTo(`${quiet}@example.com`)).toEqual([]);
	});
});
