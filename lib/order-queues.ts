// Ordering per order (API.md, "Ordering per order"), the parts with no broker in sight: which
// deliveries are ordered, how the head of a queue is told from the rows waiting behind it, and the
// order in which a batch's deliveries are written so that the earliest status becomes the head.
import type { WebhookOrdering } from "./schemas/webhooks";

/**
 * The rows that head their order's queue. A unique index holds it (migration 008), and intake's
 * ON CONFLICT names it word for word: SQLite matches a conflict target to a partial index by text.
 */
export const ORDER_HEAD_PREDICATE = "status = 'pending' AND NOT waiting AND order_key IS NOT NULL";

/** The same, for a table named `alias` in a query. */
export const orderHeadPredicate = (alias: string) => `${alias}.status = 'pending' AND NOT ${alias}.waiting AND ${alias}.order_key IS NOT NULL`;

/** A webhook's queue of one order. */
export interface OrderQueue {
	webhookId: string;
	orderKey: string;
}

/** One map key per queue (ids never hold NUL). */
export const queueKey = (webhookId: string, orderKey: string) => `${webhookId}\u0000${orderKey}`;

/** Each queue once, in the order first met. */
export function distinctQueues(queues: Iterable<OrderQueue>): OrderQueue[] {
	const byKey = new Map<string, OrderQueue>();
	for (const queue of queues) {
		const key = queueKey(queue.webhookId, queue.orderKey);
		if (!byKey.has(key)) byKey.set(key, queue);
	}
	return [...byKey.values()];
}

/** The queue a delivery joins: the order's id for a webhook ordered per order, none otherwise. */
export function orderKeyFor(ordering: WebhookOrdering | undefined, orderId: string | null): string | null {
	return orderId !== null && ordering !== "none" ? orderId : null;
}

/**
 * Events in the order they happened: by occurred_at, then as they came in (the sort is stable).
 * Written in this order, the first status of an order in a batch takes the head of its queue.
 */
export function inOccurrenceOrder<Item extends { occurredAt: string }>(items: Item[]): Item[] {
	return [...items].sort((a, b) => (a.occurredAt < b.occurredAt ? -1 : a.occurredAt > b.occurredAt ? 1 : 0));
}
