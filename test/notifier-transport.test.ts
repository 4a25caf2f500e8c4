// How the notifier hands email over: .eml files in the embedded default (no SMTP_URL) or when
// chosen with SMTP_URL=file:, and SMTP with STARTTLS, a private CA (SMTP_CA_FILE) and credentials
// in SMTP_URL.
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { simpleParser } from "mailparser";
import { startStack, type Stack } from "./helpers/stack";
import { testDatabases } from "./helpers/services";
import { headerValue, startSmtpServer, type TestSmtpServer } from "./helpers/smtp-server";
import { testCertificate } from "./helpers/https-receiver";
import type { OutboxEntry } from "../services/notifier.service";

const TOPIC = "tasking:order_status";

async function optIn(stack: Stack, sub: string, email: string): Promise<void> {
	const token = await stack.token(sub, { email, name: "Alice" });
	const response = await stack.request("PUT", "/id/v3/user/settings", { token, body: { notifications: [{ category: "tasking", settings: [{ topic: TOPIC, email: true }] }] } });
	expect(response.status).toBe(200);
}

function fulfilled(userId: string, orderName = "Harbour survey") {
	return { event_id: crypto.randomUUID(), user_id: userId, order_id: `ord-${crypto.randomBytes(4).toString("hex")}`, status: "fulfilled", order_name: orderName };
}

/** Waits (bounded) until the event's outbox row satisfies `done`. */
async function outboxRow(stack: Stack, eventId: string, done: (entry: OutboxEntry) => boolean): Promise<OutboxEntry> {
	for (let i = 0; i < 300; i++) {
		const entries: OutboxEntry[] = await stack.app.broker.call("notifier.outbox", { limit: 500 });
		const entry = entries.find(row => row.event_id === eventId);
		if (entry && done(entry)) return entry;
		await sleep(50);
	}
	throw new Error(`outbox row for ${eventId} never reached the expected state`);
}

describe.each(testDatabases())("embedded default: .eml files on %s", database => {
	let stack: Stack;

	beforeAll(async () => {
		stack = await startStack({ database, services: ["api", "topics", "users", "notifier"], env: { MAIL_POLL_INTERVAL: "100ms" } });
		await optIn(stack, "alice", "alice@example.com");
	});
	afterAll(() => stack?.stop());

	const mailDir = () => path.join(stack.dataDir, "mail");

	it("writes each email as an .eml file named after its Message-ID, with text and HTML parts", async () => {
		const event = fulfilled("alice");
		await stack.app.broker.emit("tasking.order_status", event);
		const entry = await outboxRow(stack, event.event_id, row => row.status === "sent");
		const digest = crypto.createHash("sha256").update(`${event.event_id}:alice`).digest("hex");
		expect(entry.message_id).toBe(`<${digest}@localhost>`);
		const file = path.join(mailDir(), `${digest}@localhost.eml`);
		expect(entry.smtp_response).toBe(`written to ${file}`);

		const raw = fs.readFileSync(file, "utf8");
		const parsed = await simpleParser(raw);
		expect(parsed.messageId).toBe(entry.message_id);
		expect(parsed.subject).toBe("Tasking order Harbour survey is Fulfilled");
		expect(parsed.text).toContain(event.order_id);
		expect(parsed.html).toContain(event.order_id);
		expect(headerValue(raw, "List-Unsubscribe-Post")).toBe("List-Unsubscribe=One-Click");
		// PORT=0: the link names the port the gateway really bound, so that it can be followed.
		const port = stack.app.apiPort();
		expect(port).toBeGreaterThan(0);
		expect(headerValue(raw, "List-Unsubscribe")).toMatch(new RegExp(`^<http://localhost:${port}/email/unsubscribe\\?token=[\\w.-]+>$`));
		expect(fs.readdirSync(mailDir())).toEqual([`${digest}@localhost.eml`]);
	});

	it("overwrites the file when the same email is sent again, so a resend never adds a copy", async () => {
		const event = fulfilled("alice", "Resent order");
		await stack.app.broker.emit("tasking.order_status", event);
		const first = await outboxRow(stack, event.event_id, row => row.status === "sent");
		const filesBefore = fs.readdirSync(mailDir()).sort();

		// What a crash between writing the file and recording "sent" leaves behind: a pending row.
		await stack.db("email_outbox").where({ event_id: event.event_id }).update({ status: "pending", sent_at: null, next_attempt_at: new Date().toISOString() });
		const second = await outboxRow(stack, event.event_id, row => row.status === "sent");
		expect(second.attempts).toBe(first.attempts + 1);
		expect(fs.readdirSync(mailDir()).sort()).toEqual(filesBefore);
		expect(fs.readdirSync(mailDir()).filter(name => !name.endsWith(".eml"))).toEqual([]);
	});
});

describe.each(testDatabases())("SMTP_URL=file: (how production chooses files) on %s", database => {
	let stack: Stack;
	beforeAll(async () => {
		stack = await startStack({ database, services: ["api", "topics", "users", "notifier"], env: { SMTP_URL: "file:", MAIL_POLL_INTERVAL: "100ms" } });
		await optIn(stack, "alice", "alice@example.com");
	});
	afterAll(() => stack?.stop());

	it("writes the email as an .eml file under DATA_DIR/mail, as the embedded default does", async () => {
		const event = fulfilled("alice");
		await stack.app.broker.emit("tasking.order_status", event);
		const entry = await outboxRow(stack, event.event_id, row => row.status === "sent");
		const file = path.join(stack.dataDir, "mail", `${entry.message_id!.replace(/^<|>$/g, "")}.eml`);
		expect(entry.smtp_response).toBe(`written to ${file}`);
		expect((await simpleParser(fs.readFileSync(file))).subject).toBe("Tasking order Harbour survey is Fulfilled");
	});
});

describe.each(testDatabases())("SMTP with STARTTLS, a private CA and credentials on %s", database => {
	let smtp: TestSmtpServer;
	let caDir: string;
	let good: Stack;
	let badPassword: Stack;

	beforeAll(async () => {
		const certificate = testCertificate();
		smtp = await startSmtpServer({ tls: certificate, auth: { user: "mailer", pass: "s3cret:with@odd/chars" } });
		caDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-smtp-ca-"));
		const caFile = path.join(caDir, "ca.pem");
		fs.writeFileSync(caFile, certificate.cert);
		const env = { SMTP_CA_FILE: caFile, MAIL_POLL_INTERVAL: "100ms", MAIL_RETRY_SCHEDULE: "10s" };
		const password = encodeURIComponent("s3cret:with@odd/chars");
		good = await startStack({ database, services: ["api", "topics", "users", "notifier"], env: { ...env, SMTP_URL: `smtp://mailer:${password}@127.0.0.1:${smtp.port}` } });
		badPassword = await startStack({ database, services: ["api", "topics", "users", "notifier"], env: { ...env, SMTP_URL: `smtp://mailer:wrong@127.0.0.1:${smtp.port}` } });
		await optIn(good, "alice", "alice@example.com");
		await optIn(badPassword, "alice", "alice@example.com");
	});

	afterAll(async () => {
		await good?.stop();
		await badPassword?.stop();
		await smtp?.close();
		if (caDir) fs.rmSync(caDir, { recursive: true, force: true });
	});

	it("upgrades to TLS, trusts the configured CA, logs in with the URL's credentials and delivers", async () => {
		const event = fulfilled("alice");
		await good.app.broker.emit("tasking.order_status", event);
		const entry = await outboxRow(good, event.event_id, row => row.status !== "pending");
		expect(entry).toMatchObject({ status: "sent", last_error: null, smtp_response: expect.stringMatching(/^250 /) });
		const [mail] = await smtp.waitForMessages(1, received => received.messageId === entry.message_id);
		expect({ secure: mail.secure, user: mail.user, to: mail.envelope.to }).toEqual({ secure: true, user: "mailer", to: ["alice@example.com"] });
	});

	it("keeps an email pending (not failed) while the server refuses the credentials", async () => {
		const event = fulfilled("alice", "Auth trouble");
		await badPassword.app.broker.emit("tasking.order_status", event);
		const entry = await outboxRow(badPassword, event.event_id, row => row.attempts === 1 && row.last_error !== null);
		expect(entry).toMatchObject({ status: "pending", last_error: expect.stringContaining("EAUTH") });
		expect(entry.last_error).not.toContain("wrong");
		expect(smtp.received.filter(mail => mail.messageId === entry.message_id)).toEqual([]);
	});
});
