// The order-status notification email: subject, text part, HTML part, headers and a
// deterministic Message-ID. Pure: no broker, no clock, no I/O, so the same outbox row always
// renders the same message (apart from the unsubscribe link's fresh token).
//
// Everything that comes from an event (order name, ids, details) is untrusted: it is escaped
// in the HTML, stripped of control characters in the subject, and capped in length.
import crypto from "node:crypto";
import addressparser from "nodemailer/lib/addressparser";

export interface OrderSnapshot {
	order_id: string;
	status: string;
	previous_status?: string;
	order_name?: string;
	/** ISO 8601; the intake fills it with the receive time when the event has none. */
	occurred_at: string;
	details?: Record<string, unknown>;
}

export interface EmailLinks {
	/** The one-click unsubscribe URL with its signed token. */
	unsubscribe: string;
	/** The API endpoint that changes preferences (PUT …/id/v3/user/settings). */
	settingsApi: string;
	/** The web application's notification settings page, when one is configured. */
	preferencesPage?: string;
}

export interface OrderStatusEmailInput {
	/** The outbox's de-duplication key: the event_id, or a digest of the event when it had none. */
	eventKey: string;
	userId: string;
	recipient: { name: string | null; address: string };
	order: OrderSnapshot;
	/** MAIL_FROM, e.g. `Satellite Tasking <no-reply@example.com>`. */
	from: string;
	links: EmailLinks;
	topicName: string;
}

export interface ComposedEmail {
	from: string;
	to: { name: string; address: string };
	subject: string;
	text: string;
	html: string;
	messageId: string;
	headers: Record<string, string>;
}

const MAX_SUBJECT_NAME = 120;
const MAX_DETAIL_ENTRIES = 20;
const MAX_DETAIL_TEXT = 300;

const HTML_ESCAPES: Record<string, string> = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

/** Escapes text for HTML element content and quoted attribute values. */
export function escapeHtml(text: string): string {
	return text.replace(/[&<>"']/g, char => HTML_ESCAPES[char]);
}

/** One line of plain text: control characters (CR/LF included) become spaces, then capped. */
export function singleLine(text: string, max: number): string {
	// eslint-disable-next-line no-control-regex
	const flat = text.replace(/[\u0000-\u001f\u007f-\u009f\u2028\u2029]+/g, " ").replace(/\s+/g, " ").trim();
	return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
}

/** "fulfilled" -> "Fulfilled", "in progress" -> "In progress". */
export function statusLabel(status: string): string {
	return status.charAt(0).toUpperCase() + status.slice(1);
}

/** The domain part of MAIL_FROM's address, for Message-IDs; undefined when it has none. */
export function senderDomain(from: string): string | undefined {
	const [first] = addressparser(from, { flatten: true });
	const at = first?.address.lastIndexOf("@") ?? -1;
	if (!first || at < 1 || at === first.address.length - 1) return undefined;
	return first.address.slice(at + 1).toLowerCase();
}

/**
 * `<sha256(eventKey:userId)@sender-domain>`: the same event for the same user always carries the
 * same Message-ID, so a resend after a crash can be recognised as a duplicate by mail servers
 * and clients, and the embedded file transport overwrites instead of adding a second file.
 */
export function messageIdFor(eventKey: string, userId: string, from: string): string {
	const digest = crypto.createHash("sha256").update(`${eventKey}:${userId}`).digest("hex");
	return `<${digest}@${senderDomain(from) ?? "localhost"}>`;
}

/** "2026-11-21 10:00:00 UTC": unambiguous for readers in any time zone. */
export function formatTimestamp(iso: string): string {
	const date = new Date(iso);
	if (Number.isNaN(date.getTime())) return iso;
	return `${date.toISOString().slice(0, 19).replace("T", " ")} UTC`;
}

function detailText(value: unknown): string {
	const text = typeof value === "string" ? value : JSON.stringify(value) ?? String(value);
	return singleLine(text, MAX_DETAIL_TEXT);
}

function detailRows(details: Record<string, unknown> | undefined): Array<[string, string]> {
	if (!details) return [];
	return Object.entries(details)
		.slice(0, MAX_DETAIL_ENTRIES)
		.map(([key, value]) => [singleLine(key, 80), detailText(value)]);
}

export function buildOrderStatusEmail(input: OrderStatusEmailInput): ComposedEmail {
	const { order, links, recipient } = input;
	const status = statusLabel(order.status);
	const orderName = order.order_name ? singleLine(order.order_name, MAX_SUBJECT_NAME) : undefined;
	const orderId = singleLine(order.order_id, 200);
	const shownName = orderName || orderId;
	const when = formatTimestamp(order.occurred_at);
	const previous = order.previous_status ? statusLabel(order.previous_status) : undefined;
	const greetingName = recipient.name ? singleLine(recipient.name, 100) : undefined;
	const details = detailRows(order.details);
	const topicName = singleLine(input.topicName, 200);

	const subject = `Tasking order ${shownName} is ${status}`;

	const facts: Array<[string, string]> = [
		...(orderName ? ([["Order name", orderName]] as Array<[string, string]>) : []),
		["Order id", orderId],
		["Status", status],
		...(previous ? ([["Previous status", previous]] as Array<[string, string]>) : []),
		["Changed at", when],
	];

	const textLines = [
		greetingName ? `Hello ${greetingName},` : "Hello,",
		"",
		`Your tasking order ${orderName ? `"${orderName}"` : orderId} is now ${status}.`,
		"",
		...facts.map(([label, value]) => `${label}: ${value}`),
		...(details.length ? ["", "Details:", ...details.map(([key, value]) => `  ${key}: ${value}`)] : []),
		"",
		"--",
		`You receive this email because you turned on email notifications for "${topicName}".`,
		links.preferencesPage ? `Change your notification settings: ${links.preferencesPage}` : undefined,
		`Change them through the API: PUT ${links.settingsApi}`,
		`Unsubscribe from these emails: ${links.unsubscribe}`,
		"",
	].filter((line): line is string => line !== undefined);

	const row = ([label, value]: [string, string]) =>
		`<tr><th align="left" style="padding:2px 12px 2px 0">${escapeHtml(label)}</th><td style="padding:2px 0">${escapeHtml(value)}</td></tr>`;
	const link = (href: string, label: string) => `<a href="${escapeHtml(href)}">${escapeHtml(label)}</a>`;
	const html = [
		"<!DOCTYPE html>",
		'<html lang="en"><head><meta charset="utf-8">',
		`<title>${escapeHtml(subject)}</title></head>`,
		'<body style="font-family:Arial,Helvetica,sans-serif;font-size:14px;color:#222">',
		`<p>${greetingName ? `Hello ${escapeHtml(greetingName)},` : "Hello,"}</p>`,
		`<p>Your tasking order <strong>${escapeHtml(shownName)}</strong> is now <strong>${escapeHtml(status)}</strong>.</p>`,
		`<table role="presentation">${facts.map(row).join("")}</table>`,
		...(details.length ? ["<p>Details:</p>", `<table role="presentation">${details.map(row).join("")}</table>`] : []),
		'<hr><p style="font-size:12px;color:#666">',
		`You receive this email because you turned on email notifications for &quot;${escapeHtml(topicName)}&quot;.<br>`,
		links.preferencesPage ? `${link(links.preferencesPage, "Change your notification settings")}, or change them through the API: ` : "Change your notification settings through the API: ",
		`<code>PUT ${escapeHtml(links.settingsApi)}</code>.<br>`,
		`${link(links.unsubscribe, "Unsubscribe from these emails")}.`,
		"</p></body></html>",
		"",
	].join("\n");

	return {
		from: input.from,
		to: { name: greetingName ?? "", address: recipient.address },
		subject,
		text: textLines.join("\n"),
		html,
		messageId: messageIdFor(input.eventKey, input.userId, input.from),
		headers: {
			"List-Unsubscribe": `<${links.unsubscribe}>`,
			"List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
			// RFC 3834: an automatic message; out-of-office responders should stay quiet.
			"Auto-Submitted": "auto-generated",
			"X-Auto-Response-Suppress": "OOF, AutoReply",
		},
	};
}
