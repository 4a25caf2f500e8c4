// The outbox's small rules as pure functions: the retry schedule, the de-duplication key of an
// event, and which SMTP failures are worth retrying.
import { classifySendError, emlFileName, MailSendError } from "../lib/mail-transport";
import { eventKeyOf, nextAttemptAt } from "../services/notifier.service";
import { TaskingOrderStatusEvent } from "../lib/schemas/events";

describe("outbox rules", () => {
	const first = "2026-11-21T10:00:00.000Z";
	const at = (offsetMs: number) => new Date(Date.parse(first) + offsetMs).toISOString();
	const schedule = [30_000, 120_000, 600_000];

	it("schedules retry n at the n-th offset from the first attempt, and none after the last", () => {
		expect(nextAttemptAt(first, 1, schedule, Date.parse(first) + 1_000)).toBe(at(30_000));
		expect(nextAttemptAt(first, 2, schedule, Date.parse(first) + 31_000)).toBe(at(120_000));
		expect(nextAttemptAt(first, 3, schedule, Date.parse(first) + 121_000)).toBe(at(600_000));
		expect(nextAttemptAt(first, 4, schedule, Date.parse(first) + 601_000)).toBeNull();
	});

	it("retries at once when an attempt ran past its successor's time", () => {
		const now = Date.parse(first) + 200_000;
		expect(nextAttemptAt(first, 2, schedule, now)).toBe(new Date(now).toISOString());
	});

	it("keys an event by its event_id, or by what identifies the notification when it has none", () => {
		const parse = (payload: unknown) => TaskingOrderStatusEvent.parse(payload);
		const base = { user_id: "alice", order_id: "ord-1", status: "fulfilled", occurred_at: "2026-11-21T10:00:00Z" };
		expect(eventKeyOf(parse({ ...base, event_id: "6f0a3c1e-8a8e-4a57-9d7a-1d1c2b3a4f50" }))).toBe("6f0a3c1e-8a8e-4a57-9d7a-1d1c2b3a4f50");
		const derived = eventKeyOf(parse(base));
		expect(derived).toMatch(/^sha256:[0-9a-f]{64}$/);
		expect(eventKeyOf(parse({ ...base, status: "Fulfilled", order_name: "renamed" }))).toBe(derived);
		expect(eventKeyOf(parse({ ...base, status: "failed" }))).not.toBe(derived);
		expect(eventKeyOf(parse({ ...base, user_id: "bob" }))).not.toBe(derived);
		expect(eventKeyOf(parse({ ...base, order_id: "ord-2" }))).not.toBe(derived);
	});

	it("retries connection trouble, timeouts, 4xx replies and authentication failures", () => {
		const transient = [
			{ code: "ECONNECTION", message: "connect ECONNREFUSED 127.0.0.1:25", command: "CONN" },
			{ code: "ETIMEDOUT", message: "Greeting never received", command: "CONN" },
			{ code: "ESOCKET", message: "self-signed certificate", command: "CONN" },
			{ code: "EENVELOPE", responseCode: 451, response: "451 4.7.1 Greylisted", command: "RCPT TO" },
			{ code: "EMESSAGE", responseCode: 452, response: "452 4.3.1 Insufficient storage", command: "DATA" },
			{ code: "EAUTH", responseCode: 535, response: "535 5.7.8 Authentication failed", command: "AUTH PLAIN" },
			new Error("something unexpected"),
		];
		for (const failure of transient) expect(classifySendError(failure)).toMatchObject({ permanent: false });
	});

	it("gives up on 5xx replies and on envelopes nodemailer itself refuses", () => {
		const permanent = [
			{ code: "EENVELOPE", responseCode: 550, response: "550 5.1.1 No such user", command: "RCPT TO" },
			{ code: "EMESSAGE", responseCode: 554, response: "554 5.6.0 Message rejected", command: "DATA" },
			{ code: "EENVELOPE", message: "Invalid recipient", command: "API" },
		];
		for (const failure of permanent) expect(classifySendError(failure)).toMatchObject({ permanent: true });
		const described = classifySendError(permanent[0]);
		expect(described).toBeInstanceOf(MailSendError);
		expect(described.message).toBe("EENVELOPE at RCPT TO 550 5.1.1 No such user");
		expect(described.responseCode).toBe(550);
	});

	it("names .eml files after the Message-ID, with nothing that could leave the mail folder", () => {
		expect(emlFileName("<abc123@mail.example.com>")).toBe("abc123@mail.example.com.eml");
		expect(emlFileName("<../../etc/passwd@x>")).toBe(".._.._etc_passwd@x.eml");
	});
});
