// The notifier end to end: events in through the broker, preferences set over the real HTTP API,
// email out through a real SMTP server, and the one-click unsubscribe through the real gateway.
// The stack runs without the dispatcher, which shows that email does not depend on it.
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import { expectProblem, type Stack } from "./helpers/stack";
import { testDatabases } from "./helpers/services";
import { headerValue, type ReceivedMail, type TestSmtpServer } from "./helpers/smtp-server";
import { setOrderStatusEmail, signIn as signInAs, useNotifierStack } from "./helpers/notifier-stack";
import { deriveUnsubscribeKey, signUnsubscribeToken } from "../lib/unsubscribe-token";
import type { OutboxEntry } from "../services/notifier.service";
import type { TaskingOrderStatusInput } from "../lib/schemas/events";
import { metricTotal, waitUntil } from "./helpers/delivery-stack";

const TOPIC = "tasking:order_status";
const HOSTILE_NAME = `<script>alert("owned")</script><img src=x onerror=alert(1)>`;

type OrderEvent = TaskingOrderStatusInput;

function orderEvent(userId: string, status: string, extra: Partial<OrderEvent> = {}): OrderEvent {
	return {
		event_id: crypto.randomUUID(),
		user_id: userId,
		customer_id: "acme",
		order_id: `ord-${crypto.randomBytes(4).toString("hex")}`,
		status,
		previous_status: "in progress",
		order_name: "Harbour survey",
		occurred_at: "2026-11-21T10:00:00Z",
		...extra,
	};
}

describe.each(testDatabases())("notifier on %s", database => {
	const env = useNotifierStack(database, {
		MAIL_FROM: "Satellite Tasking <no-reply@mail.example.test>",
		// Six attempts over 4.5 s: the refused-connection test must see its email still pending
		// after two refusals, and on a busy machine the four attempts of 300ms,600ms,900ms had all
		// failed by the time it looked.
		MAIL_RETRY_SCHEDULE: "300ms,600ms,900ms,1200ms,1500ms",
		MAIL_POLL_INTERVAL: "100ms",
		MAIL_SEND_TIMEOUT: "5s",
		PUBLIC_BASE_URL: "https://public.example.test/notify/",
	});
	let stack: Stack;
	let smtp: TestSmtpServer;
	beforeAll(() => {
		({ stack, smtp } = env);
	});

	const signIn = (sub: string, customer: string, email: string | undefined) => signInAs(stack, sub, { customer, name: sub.charAt(0).toUpperCase() + sub.slice(1), ...(email ? { email } : {}) });
	const setEmail = (token: string, email: boolean) => setOrderStatusEmail(stack, token, email);

	async function emailSetting(token: string): Promise<boolean> {
		const details = await stack.request("GET", "/id/v3/user/details", { token });
		const setting = details.body.user_metadata.notifications.flatMap((entry: { settings: Array<{ topic: string; email: boolean }> }) => entry.settings).find((entry: { topic: string }) => entry.topic === TOPIC);
		return setting.email;
	}

	function outbox(params: Record<string, unknown> = {}): Promise<OutboxEntry[]> {
		return stack.app.broker.call("notifier.outbox", { limit: 500, ...params });
	}

	/** Waits (bounded) until the event's outbox row has settled, and returns it. */
	async function settled(eventId: string): Promise<OutboxEntry> {
		for (let i = 0; i < 300; i++) {
			const entry = (await outbox()).find(row => row.event_id === eventId);
			if (entry && entry.status !== "pending") return entry;
			await sleep(50);
		}
		throw new Error(`outbox row for ${eventId} did not settle`);
	}

	function emit(event: unknown): Promise<void> {
		return stack.app.broker.emit("tasking.order_status", event);
	}

	/** The value of a Prometheus counter of the notifier, by label. */
	const metric = (name: string, label: string, value: string) => metricTotal(stack.app.broker, name, { [label]: value });

	const mailsTo = (address: string) => smtp.received.filter(mail => mail.envelope.to.includes(address));
	const byMessageId = (messageId: string) => (mail: ReceivedMail) => mail.messageId === messageId;

	it("sends an opted-in owner exactly one email for each terminal status, with text and HTML parts", async () => {
		const token = await signIn("alice", "acme", "alice@example.com");
		await setEmail(token, true);
		const events = ["fulfilled", "Failed", "EXPIRED"].map(status => orderEvent("alice", status));
		for (const event of events) await emit(event);
		const entries = await Promise.all(events.map(event => settled(event.event_id!)));
		expect(entries.map(entry => entry.status)).toEqual(["sent", "sent", "sent"]);

		for (const [index, entry] of entries.entries()) {
			const [mail] = await smtp.waitForMessages(1, byMessageId(entry.message_id));
			expect(smtp.received.filter(byMessageId(entry.message_id))).toHaveLength(1);
			expect(mail.envelope.to).toEqual(["alice@example.com"]);
			expect(mail.parsed.subject).toBe(`Tasking order Harbour survey is ${["Fulfilled", "Failed", "Expired"][index]}`);
			expect(mail.parsed.from?.value[0].address).toBe("no-reply@mail.example.test");
			expect(mail.parsed.to && !Array.isArray(mail.parsed.to) ? mail.parsed.to.value[0] : undefined).toEqual({ name: "Alice", address: "alice@example.com" });
			expect(mail.parsed.text).toContain(events[index].order_id);
			expect(mail.parsed.text).toContain("2026-11-21 10:00:00 UTC");
			expect(mail.parsed.text).toContain("Change your notification settings: https://public.example.test/notify/notifications\n");
			expect(mail.parsed.text).toContain("PUT https://public.example.test/notify/id/v3/user/settings");
			expect(mail.parsed.html).toContain('<a href="https://public.example.test/notify/notifications">Change your notification settings</a>');
			expect(mail.parsed.html).toContain(events[index].order_id);
			expect(mail.parsed.html).toContain("2026-11-21 10:00:00 UTC");
			expect(headerValue(mail.raw, "List-Unsubscribe-Post")).toBe("List-Unsubscribe=One-Click");
			expect(headerValue(mail.raw, "List-Unsubscribe")).toMatch(/^<https:\/\/public\.example\.test\/notify\/email\/unsubscribe\?token=[\w.-]+>$/);
			expect(headerValue(mail.raw, "Auto-Submitted")).toBe("auto-generated");
			// Deterministic: sha256(event_id:user_id) at the sender's domain.
			const digest = crypto.createHash("sha256").update(`${events[index].event_id}:alice`).digest("hex");
			expect(mail.messageId).toBe(`<${digest}@mail.example.test>`);
		}
		expect(mailsTo("alice@example.com")).toHaveLength(3);
		// All of that without any dispatcher in the stack.
		expect(stack.app.broker.registry.getServiceList({}).map((service: { name: string }) => service.name)).not.toContain("dispatcher");
	});

	it("sends nothing for a user who did not opt in, a non-terminal status, or another user than the owner", async () => {
		await signIn("bob", "acme", "bob@example.com"); // never opted in
		const carol = await signIn("carol", "globex", "carol@example.com"); // another customer, opted in
		await setEmail(carol, true);
		const dave = await signIn("dave", "acme", "dave@example.com"); // same customer as alice, opted in
		await setEmail(dave, true);
		const before = smtp.received.length;

		// Known not to want it: no outbox row at all (the emit returns once the notifier handled it).
		const notOptedIn = orderEvent("bob", "fulfilled");
		await emit(notOptedIn);
		expect((await outbox()).find(row => row.event_id === notOptedIn.event_id)).toBeUndefined();

		const nonTerminal = ["committed", "staged", "in progress", "rejected", "cancelled"].map(status => orderEvent("alice", status));
		for (const event of nonTerminal) await emit(event);
		// alice's fulfilled order goes to alice alone: carol and dave opted in but do not own it.
		const alicesOrder = orderEvent("alice", "fulfilled", { customer_id: "acme" });
		await emit(alicesOrder);
		expect((await settled(alicesOrder.event_id!)).status).toBe("sent");

		const rows = await outbox();
		for (const event of nonTerminal) expect(rows.find(row => row.event_id === event.event_id)).toBeUndefined();
		const received = smtp.received.slice(before);
		expect(received.map(mail => mail.envelope.to)).toEqual([["alice@example.com"]]);
		expect(mailsTo("bob@example.com")).toEqual([]);
		expect(mailsTo("carol@example.com")).toEqual([]);
		expect(mailsTo("dave@example.com")).toEqual([]);
	});

	it("sends one email for an event that arrives twice, at once or later", async () => {
		const event = orderEvent("alice", "fulfilled");
		await Promise.all([emit(event), emit({ ...event })]);
		const entry = await settled(event.event_id!);
		await emit({ ...event, order_name: "renamed in a replay" });
		// A later, different event is a marker: once it is through, the replay has been handled too.
		const marker = orderEvent("alice", "expired");
		await emit(marker);
		await settled(marker.event_id!);
		expect(smtp.received.filter(byMessageId(entry.message_id))).toHaveLength(1);
		expect((await outbox()).filter(row => row.event_id === event.event_id)).toHaveLength(1);
	});

	it("recognises a repeat of an event that came without an event_id", async () => {
		const event = orderEvent("alice", "failed", { event_id: undefined, order_id: `ord-noid-${crypto.randomBytes(3).toString("hex")}` });
		await emit(event);
		await emit({ ...event });
		const marker = orderEvent("alice", "expired");
		await emit(marker);
		await settled(marker.event_id!);
		// The marker's row can be sent before the first event's: emails go out several at a time.
		const rows = await waitUntil(
			async () => (await outbox()).filter(row => row.order_id === event.order_id),
			found => found.length > 1 || (found.length === 1 && found[0].status !== "pending"),
			"the event's outbox row settled",
		);
		expect(rows).toHaveLength(1);
		expect(rows[0]).toMatchObject({ event_id: null, status: "sent" });
		expect(smtp.received.filter(byMessageId(rows[0].message_id))).toHaveLength(1);
	});

	it("retries a server that answers 4xx twice, then delivers exactly one email", async () => {
		const event = orderEvent("alice", "fulfilled", { order_name: "Greylisted order" });
		smtp.setAnswer(attempt => (attempt.subject.includes("Greylisted order") && attempt.attempt <= 2 ? { code: 451, message: "4.7.1 Greylisted, try again later" } : "accept"));
		const retriesBefore = await metric("email_send_attempts_total", "result", "retry");
		try {
			await emit(event);
			const entry = await settled(event.event_id!);
			expect(entry).toMatchObject({ status: "sent", attempts: 3 });
			expect(smtp.attempts.filter(attempt => attempt.messageId === entry.message_id).map(attempt => attempt.attempt)).toEqual([1, 2, 3]);
			expect(await metric("email_send_attempts_total", "result", "retry")).toBe(retriesBefore + 2);
			expect(smtp.received.filter(byMessageId(entry.message_id))).toHaveLength(1);
		} finally {
			smtp.setAnswer(() => "accept");
		}
	});

	it("retries while the server refuses connections, then delivers exactly one email", async () => {
		const event = orderEvent("alice", "expired", { order_name: "Refused twice" });
		let refusedAttempts = 0;
		await smtp.stopListening();
		try {
			await emit(event);
			// Wait (bounded) until two attempts have failed on a refused connection and released their claim.
			// At least two: on a busy machine a third may have failed before this look (the retry comes
			// 600 ms after the second), as it once did in CI.
			let row: { attempts: number; lease_owner: string | null; status: string; last_error: string | null } | undefined;
			for (let i = 0; i < 300 && !(row && Number(row.attempts) >= 2 && row.lease_owner === null); i++) {
				await sleep(20);
				row = await stack.db("email_outbox").where({ event_id: event.event_id }).first();
			}
			expect(row).toMatchObject({ status: "pending", last_error: expect.stringMatching(/ECONNECTION|ECONNREFUSED/) });
			expect(Number(row!.attempts)).toBeGreaterThanOrEqual(2);
			refusedAttempts = Number(row!.attempts);
		} finally {
			await smtp.listen();
		}
		const entry = await settled(event.event_id!);
		expect(entry.status).toBe("sent");
		// One more attempt than were refused, or two if one more was refused before the server was back.
		expect(Number(entry.attempts) - refusedAttempts).toBeGreaterThanOrEqual(1);
		expect(Number(entry.attempts) - refusedAttempts).toBeLessThanOrEqual(2);
		expect(smtp.received.filter(byMessageId(entry.message_id))).toHaveLength(1);
	});

	it("marks an email failed, without retrying, when the server answers 5xx", async () => {
		const event = orderEvent("alice", "failed", { order_name: "Bounced order" });
		smtp.setAnswer(attempt => (attempt.subject.includes("Bounced order") ? { code: 550, message: "5.1.1 Mailbox unavailable" } : "accept"));
		const failedBefore = await metric("emails_finished_total", "status", "failed");
		try {
			await emit(event);
			const entry = await settled(event.event_id!);
			expect(entry).toMatchObject({ status: "failed", attempts: 1, last_error: expect.stringContaining("550") });
			expect(smtp.received.filter(byMessageId(entry.message_id))).toEqual([]);
			// Counted after the row's UPDATE commits, so the row can be seen failed a moment before the count.
			const failedNow = await waitUntil(() => metric("emails_finished_total", "status", "failed"), count => count > failedBefore, "the failed email to be counted");
			expect(failedNow).toBe(failedBefore + 1);
			// The operators' view lists it; no unsubscribe token leaks through it.
			const failed = await stack.app.broker.call<OutboxEntry[], object>("notifier.outbox", { status: "failed" });
			expect(failed.map(row => row.event_id)).toContain(event.event_id);
			expect(JSON.stringify(failed)).not.toMatch(/token|eyJ/);
		} finally {
			smtp.setAnswer(() => "accept");
		}
	});

	it("escapes a hostile order name in the HTML part", async () => {
		const event = orderEvent("alice", "fulfilled", { order_id: `ord-\u0000-${crypto.randomBytes(3).toString("hex")}`, order_name: HOSTILE_NAME, details: { note: "<b>bold</b>\u0000" } });
		await emit(event);
		const entry = await settled(event.event_id!);
		const [mail] = await smtp.waitForMessages(1, byMessageId(entry.message_id));
		const html = String(mail.parsed.html);
		expect(html).not.toContain("<script");
		expect(html).not.toContain("<img");
		expect(html).not.toContain("<b>bold");
		expect(html).toContain("&lt;script&gt;alert(&quot;owned&quot;)&lt;/script&gt;");
		expect(mail.parsed.subject).toBe(`Tasking order ${HOSTILE_NAME} is Fulfilled`);
		// A NUL (which PostgreSQL text cannot store) neither loses the email nor reaches it.
		expect(mail.raw).not.toContain("\u0000");
		expect(mail.parsed.text).toContain(event.order_id.replace("\u0000", " "));
	});

	it("records an invalid event as rejected, sends nothing, and keeps working", async () => {
		const before = smtp.received.length;
		const rejectedBefore = Number((await stack.db("email_rejected_events").count({ n: "*" }))[0].n);
		await emit({ user_id: "alice", order_id: "ord-bad", status: "teleported" });
		await emit({ user_id: "alice", status: "fulfilled" });
		await emit("not even an object");
		const marker = orderEvent("alice", "fulfilled");
		await emit(marker);
		expect((await settled(marker.event_id!)).status).toBe("sent");
		const rejected = await stack.db("email_rejected_events").select().orderBy("received_at");
		expect(rejected).toHaveLength(rejectedBefore + 3);
		expect(JSON.parse(rejected[rejectedBefore].errors)).toEqual([expect.objectContaining({ path: "status" })]);
		expect(smtp.received.length).toBe(before + 1);
	});

	describe("one-click unsubscribe", () => {
		async function unsubscribeLinkOf(userId: string, address: string): Promise<{ path: string; token: string }> {
			const event = orderEvent(userId, "fulfilled");
			await emit(event);
			const entry = await settled(event.event_id!);
			expect(entry.status).toBe("sent");
			const [mail] = await smtp.waitForMessages(1, byMessageId(entry.message_id));
			expect(mail.envelope.to).toEqual([address]);
			const link = new URL(/^<([^>]+)>$/.exec(headerValue(mail.raw, "List-Unsubscribe"))![1]);
			expect(link.origin + link.pathname).toBe("https://public.example.test/notify/email/unsubscribe");
			expect(mail.parsed.text).toContain(link.href);
			return { path: `/email/unsubscribe${link.search}`, token: link.searchParams.get("token")! };
		}

		it("shows a confirmation page on GET and changes nothing", async () => {
			const token = await signIn("erin", "acme", "erin@example.com");
			await setEmail(token, true);
			const link = await unsubscribeLinkOf("erin", "erin@example.com");
			for (let i = 0; i < 2; i++) {
				const page = await stack.request("GET", link.path);
				expect(page.status).toBe(200);
				expect(page.headers.get("content-type")).toMatch(/^text\/html/);
				expect(page.headers.get("cache-control")).toBe("no-store");
				expect(page.headers.get("referrer-policy")).toBe("no-referrer");
				expect(page.headers.get("x-frame-options")).toBe("DENY");
				expect(page.text).toContain('<form method="post">');
				expect(page.text).toContain('<input type="hidden" name="List-Unsubscribe" value="One-Click">');
				expect(page.text).toContain("Tasking order status updates");
				expect(page.text).not.toContain(link.token);
			}
			expect(await emailSetting(token)).toBe(true);
		});

		it("turns email off with an RFC 8058 one-click POST, idempotently, and stops further emails", async () => {
			const token = await signIn("frank", "acme", "frank@example.com");
			await setEmail(token, true);
			const link = await unsubscribeLinkOf("frank", "frank@example.com");
			for (let i = 0; i < 2; i++) {
				const response = await stack.request("POST", link.path, {
					body: "List-Unsubscribe=One-Click",
					headers: { "content-type": "application/x-www-form-urlencoded" },
				});
				expect(response.status).toBe(200);
				expect(response.headers.get("content-type")).toMatch(/^text\/html/);
				expect(response.text).toContain("You are unsubscribed");
				expect(await emailSetting(token)).toBe(false);
			}
			// The unsubscribe is announced to the notifier: the next event is not even queued.
			const after = orderEvent("frank", "failed");
			await emit(after);
			expect((await outbox()).find(row => row.event_id === after.event_id)).toBeUndefined();
			expect(mailsTo("frank@example.com")).toHaveLength(1);
		});

		it("refuses tampered, expired, foreign and missing tokens and changes nothing", async () => {
			const token = await signIn("grace", "acme", "grace@example.com");
			await setEmail(token, true);
			const link = await unsubscribeLinkOf("grace", "grace@example.com");
			const [header, payload, signature] = link.token.split(".");
			const claims = JSON.parse(Buffer.from(payload, "base64url").toString());
			const retargeted = [header, Buffer.from(JSON.stringify({ ...claims, sub: "alice" })).toString("base64url"), signature].join(".");
			const key = deriveUnsubscribeKey(stack.config.SECRETS_KEY!);
			const expired = await signUnsubscribeToken({ userId: "grace", topic: TOPIC }, key, 60_000, new Date(Date.now() - 86_400_000));
			const foreignKey = await signUnsubscribeToken({ userId: "grace", topic: TOPIC }, deriveUnsubscribeKey(crypto.randomBytes(32).toString("base64")), 60_000);
			const bearer = await stack.token("grace");
			const form = { "content-type": "application/x-www-form-urlencoded" };

			for (const bad of [retargeted, expired, foreignKey, bearer, "garbage"]) {
				const query = `/email/unsubscribe?token=${encodeURIComponent(bad)}`;
				const post = await stack.request("POST", query, { body: "List-Unsubscribe=One-Click", headers: form });
				expectProblem(post, 422);
				expect(post.body.errors).toEqual([{ path: "token", message: bad === expired ? "The unsubscribe link has expired" : "The unsubscribe link is invalid" }]);
				const page = await stack.request("GET", query);
				expect(page.status).toBe(422);
				expect(page.headers.get("content-type")).toMatch(/^text\/html/);
				expect(page.text).toContain("Nothing was changed");
			}
			expectProblem(await stack.request("POST", "/email/unsubscribe", { body: "List-Unsubscribe=One-Click", headers: form }), 422);
			expectProblem(await stack.request("POST", link.path, { body: "List-Unsubscribe=Something-Else", headers: form }), 422);
			expect((await stack.request("GET", "/email/unsubscribe")).status).toBe(422);
			expect(await emailSetting(token)).toBe(true);
			expect(await emailSetting(await stack.token("alice"))).toBe(true);
		});
	});
});
