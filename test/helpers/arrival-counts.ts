// Counting what arrived in a cluster test, from the receiver's and the SMTP server's own records:
// a delivery is a (webhook, order) pair answered 200, an email is one whose text names the order.
// Lost and repeated are counted apart, so that a repeat never stands in for a missing delivery.
import { TASKING_ORDER_STATUS_TOPIC, type TaskingOrderStatusInput } from "../../lib/schemas/events";
import { pathOf, verifyDelivery, type ReceivedRequest } from "./https-receiver";
import type { ReceivedMail } from "./smtp-server";

/** The part of a cluster's webhook that counting needs. */
export interface CountedWebhook {
	secret: string;
	/** The receiver path this webhook delivers to. */
	path: string;
	customer: string;
}

/** What a fault test prints and checks: 0 lost, repeats counted. */
export interface DeliveryFigures {
	sent: number;
	expected: number;
	delivered: number;
	lost: number;
	repeats: number;
	requests: number;
	/** Requests answered with something other than 200 (scripted failures, timeouts). */
	failed_answers: number;
	bad_signatures: number;
	/** Verified payloads that do not say what their event said (type, order, status, user). */
	wrong_payloads: number;
	/** Requests for an order these webhooks should not get (another customer's, or unknown). */
	unexpected: number;
	/** Keys delivered under more than one webhook-id: two delivery rows for one event and webhook. */
	split_deliveries: number;
	/** The first few repeated keys, for the log. */
	repeated: string[];
	/** The first few lost keys, for the log. */
	missing: string[];
}

export interface EmailFigures {
	expected: number;
	delivered: number;
	lost: number;
	repeats: number;
	/** Emails for events that should not have produced one (wrong user, status or opt-out). */
	unexpected: number;
	repeated: string[];
	missing: string[];
}

/** A delivery's identity in the counts: the webhook (its receiver path) and the order. */
function deliveryKey(path: string, orderId: string): string {
	return `${path}|${orderId}`;
}

function orderIdOf(request: ReceivedRequest): string {
	try {
		return String(JSON.parse(request.body)?.data?.order_id);
	} catch {
		return "(unparsable body)";
	}
}

/** How many distinct (webhook, order) pairs were answered 200; only those in `among`, if given. */
export function answeredKeyCount(requests: ReceivedRequest[], webhooks: CountedWebhook[], among?: Set<string>): number {
	const paths = new Set(webhooks.map(webhook => webhook.path));
	const keys = new Set<string>();
	for (const request of requests) {
		if (request.answeredStatus !== 200 || !paths.has(pathOf(request))) continue;
		const key = deliveryKey(pathOf(request), orderIdOf(request));
		if (!among || among.has(key)) keys.add(key);
	}
	return keys.size;
}

/** The (webhook, order) pairs these events must reach: each event goes to its customer's webhooks. */
export function expectedDeliveryKeys(webhooks: CountedWebhook[], events: TaskingOrderStatusInput[], customerOf: (event: TaskingOrderStatusInput) => string | undefined): string[] {
	return webhooks.flatMap(webhook => events.filter(event => customerOf(event) === webhook.customer).map(event => deliveryKey(webhook.path, event.order_id)));
}

/**
 * Counts what the receiver got for these webhooks and events against the pairs expected: every
 * request is verified with the standardwebhooks library and its payload checked against its event.
 */
export function countDeliveries(requests: ReceivedRequest[], webhooks: CountedWebhook[], events: TaskingOrderStatusInput[], expectedKeys: string[], sent: number): DeliveryFigures {
	const byPath = new Map(webhooks.map(webhook => [webhook.path, webhook]));
	const eventByOrder = new Map(events.map(event => [event.order_id, event]));
	const answered = new Map<string, number>();
	const webhookIds = new Map<string, Set<string>>();
	let requestCount = 0;
	let failedAnswers = 0;
	let badSignatures = 0;
	let wrongPayloads = 0;
	for (const request of requests) {
		const webhook = byPath.get(pathOf(request));
		if (!webhook) continue;
		requestCount += 1;
		try {
			const payload = verifyDelivery(request, webhook.secret) as { type?: string; data?: Record<string, unknown> };
			const event = eventByOrder.get(String(payload.data?.order_id));
			const matches =
				event !== undefined &&
				payload.type === TASKING_ORDER_STATUS_TOPIC &&
				payload.data?.status === String(event.status).toLowerCase() &&
				payload.data?.user_id === event.user_id;
			if (!matches) wrongPayloads += 1;
		} catch {
			badSignatures += 1;
		}
		const key = deliveryKey(webhook.path, orderIdOf(request));
		const ids = webhookIds.get(key) ?? new Set<string>();
		ids.add(String(request.headers["webhook-id"]));
		webhookIds.set(key, ids);
		if (request.answeredStatus === 200) answered.set(key, (answered.get(key) ?? 0) + 1);
		else failedAnswers += 1;
	}
	const expectedSet = new Set(expectedKeys);
	const unexpected = [...webhookIds.keys()].filter(key => !expectedSet.has(key)).length;
	const missing = expectedKeys.filter(key => !answered.has(key));
	const repeatedKeys = [...answered].filter(([, count]) => count > 1);
	return {
		sent,
		expected: expectedKeys.length,
		delivered: expectedKeys.length - missing.length,
		lost: missing.length,
		repeats: repeatedKeys.reduce((sum, [, count]) => sum + count - 1, 0),
		requests: requestCount,
		failed_answers: failedAnswers,
		bad_signatures: badSignatures,
		wrong_payloads: wrongPayloads,
		unexpected,
		split_deliveries: [...webhookIds.values()].filter(ids => ids.size > 1).length,
		repeated: repeatedKeys.slice(0, 10).map(([key, count]) => `${key} x${count}`),
		missing: missing.slice(0, 10),
	};
}

/** Counts the emails the SMTP server accepted for these events (by the order id in the text). */
export function countEmails(mails: ReceivedMail[], expectedEvents: TaskingOrderStatusInput[], allEvents: TaskingOrderStatusInput[]): EmailFigures {
	const expected = new Set(expectedEvents.map(event => event.order_id));
	const ours = new Set(allEvents.map(event => event.order_id));
	const counts = new Map<string, number>();
	let unexpected = 0;
	for (const mail of mails) {
		const orderId = /^Order id: (.+)$/m.exec(mail.parsed.text ?? "")?.[1]?.trim();
		if (!orderId || !ours.has(orderId)) continue;
		if (!expected.has(orderId)) unexpected += 1;
		counts.set(orderId, (counts.get(orderId) ?? 0) + 1);
	}
	const missing = [...expected].filter(orderId => !counts.has(orderId));
	const repeated = [...counts].filter(([orderId, count]) => expected.has(orderId) && count > 1);
	return {
		expected: expected.size,
		delivered: expected.size - missing.length,
		lost: missing.length,
		repeats: repeated.reduce((sum, [, count]) => sum + count - 1, 0),
		unexpected,
		repeated: repeated.slice(0, 10).map(([orderId, count]) => `${orderId} x${count}`),
		missing: missing.slice(0, 10),
	};
}
