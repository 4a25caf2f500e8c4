// The order-status email as a pure function: subject, parts, escaping, Message-ID, headers.
import { buildOrderStatusEmail, escapeHtml, formatTimestamp, messageIdFor, senderDomain, singleLine, type OrderStatusEmailInput } from "../lib/email-message";

const HOSTILE = `<script>alert("x")</script><img src=x onerror='y'>&`;

function input(overrides: Partial<OrderStatusEmailInput> = {}, order: Partial<OrderStatusEmailInput["order"]> = {}): OrderStatusEmailInput {
	return {
		eventKey: "6f0a3c1e-8a8e-4a57-9d7a-1d1c2b3a4f50",
		userId: "alice",
		recipient: { name: "Alice", address: "alice@example.com" },
		order: { order_id: "ord-42", status: "fulfilled", previous_status: "in progress", order_name: "Harbour survey", occurred_at: "2026-11-21T10:00:00.000Z", ...order },
		from: "Satellite Tasking <no-reply@mail.example.com>",
		topicName: "Tasking order status updates",
		links: {
			unsubscribe: "https://api.example.com/email/unsubscribe?token=abc.def.ghi&x=1",
			settingsApi: "https://api.example.com/id/v3/user/settings",
		},
		...overrides,
	};
}

describe("order-status email", () => {
	it("names the order and the status in the subject", () => {
		expect(buildOrderStatusEmail(input()).subject).toBe("Tasking order Harbour survey is Fulfilled");
		expect(buildOrderStatusEmail(input({}, { status: "failed", order_name: undefined })).subject).toBe("Tasking order ord-42 is Failed");
		expect(buildOrderStatusEmail(input({}, { status: "expired" })).subject).toBe("Tasking order Harbour survey is Expired");
	});

	it("keeps control characters and line breaks out of the subject, and caps its length", () => {
		const email = buildOrderStatusEmail(input({}, { order_name: `A\r\nBcc: evil@example.com\u0000${"x".repeat(500)}` }));
		expect([...email.subject].filter(char => char.charCodeAt(0) < 0x20)).toEqual([]);
		expect(email.subject.startsWith("Tasking order A Bcc: evil@example.com x")).toBe(true);
		expect(email.subject.length).toBeLessThan(160);
	});

	it("has a text part and an HTML part with the order id, status, time and both links", () => {
		const email = buildOrderStatusEmail(input());
		for (const part of [email.text, email.html]) {
			expect(part).toContain("ord-42");
			expect(part).toContain("Fulfilled");
			expect(part).toContain("In progress");
			expect(part).toContain("2026-11-21 10:00:00 UTC");
			expect(part).toContain("/id/v3/user/settings");
		}
		expect(email.text).toContain("Hello Alice,");
		expect(email.text).toContain("https://api.example.com/email/unsubscribe?token=abc.def.ghi&x=1");
		expect(email.html).toContain('href="https://api.example.com/email/unsubscribe?token=abc.def.ghi&amp;x=1"');
		expect(email.html).toMatch(/^<!DOCTYPE html>/);
	});

	it("links the web application's settings page when one is configured", () => {
		const email = buildOrderStatusEmail(input({ links: { ...input().links, preferencesPage: "https://app.example.com/settings/notifications" } }));
		expect(email.text).toContain("Change your notification settings: https://app.example.com/settings/notifications");
		expect(email.html).toContain('href="https://app.example.com/settings/notifications"');
	});

	it("escapes a hostile order name, recipient name and details in the HTML", () => {
		const email = buildOrderStatusEmail(
			input({ recipient: { name: HOSTILE, address: "alice@example.com" } }, { order_name: HOSTILE, details: { [HOSTILE]: HOSTILE, nested: { html: "<b>bold</b>" } } }),
		);
		expect(email.html).not.toContain("<script>");
		expect(email.html).not.toContain("<img");
		expect(email.html).not.toContain("<b>bold");
		expect(email.html).toContain("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;img src=x onerror=&#39;y&#39;&gt;&amp;");
		// The only tags are ours.
		const tags = new Set([...email.html.matchAll(/<\/?([a-zA-Z!]+)/g)].map(match => match[1].toLowerCase()));
		expect([...tags].sort()).toEqual(["!doctype", "a", "body", "br", "code", "head", "hr", "html", "meta", "p", "strong", "table", "td", "th", "title", "tr"]);
	});

	it("lists scalar and nested details in both parts, bounded", () => {
		const details: Record<string, unknown> = { resolution_m: 0.5, archive: true, region: { lat: 51.5, lon: -0.1 } };
		for (let i = 0; i < 40; i++) details[`extra_${i}`] = "y".repeat(1000);
		const email = buildOrderStatusEmail(input({}, { details }));
		expect(email.text).toContain("  resolution_m: 0.5");
		expect(email.text).toContain('  region: {"lat":51.5,"lon":-0.1}');
		expect(email.text).not.toContain("extra_30");
		expect(email.text).not.toContain("y".repeat(400));
	});

	it("carries RFC 8058 one-click headers and marks itself automatic", () => {
		const { headers } = buildOrderStatusEmail(input());
		expect(headers["List-Unsubscribe"]).toBe("<https://api.example.com/email/unsubscribe?token=abc.def.ghi&x=1>");
		expect(headers["List-Unsubscribe-Post"]).toBe("List-Unsubscribe=One-Click");
		expect(headers["Auto-Submitted"]).toBe("auto-generated");
	});

	it("derives the same Message-ID from the same event and user, and a different one otherwise", () => {
		const first = buildOrderStatusEmail(input()).messageId;
		expect(buildOrderStatusEmail(input({ links: { ...input().links, unsubscribe: "https://other/?token=zzz" } })).messageId).toBe(first);
		expect(first).toMatch(/^<[0-9a-f]{64}@mail\.example\.com>$/);
		expect(messageIdFor("6f0a3c1e-8a8e-4a57-9d7a-1d1c2b3a4f50", "bob", "no-reply@mail.example.com")).not.toBe(first);
		expect(messageIdFor("another-event", "alice", "no-reply@mail.example.com")).not.toBe(first);
		expect(messageIdFor("e", "u", "not an address")).toMatch(/@localhost>$/);
	});

	it("reads the sender domain from MAIL_FROM", () => {
		expect(senderDomain("Satellite Tasking <No-Reply@Mail.Example.com>")).toBe("mail.example.com");
		expect(senderDomain("no-reply@localhost")).toBe("localhost");
		expect(senderDomain("nobody")).toBeUndefined();
		expect(senderDomain("")).toBeUndefined();
	});

	it("has small helpers that behave", () => {
		expect(escapeHtml(`&<>"'`)).toBe("&amp;&lt;&gt;&quot;&#39;");
		expect(singleLine("a\n\tb\u2028c", 100)).toBe("a b c");
		expect(singleLine("abcdef", 4)).toBe("abc…");
		expect(formatTimestamp("2026-11-21T11:00:00+01:00")).toBe("2026-11-21 10:00:00 UTC");
		expect(formatTimestamp("not a date")).toBe("not a date");
	});
});
