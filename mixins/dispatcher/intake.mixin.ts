// Dispatcher intake: how an order status event becomes persisted deliveries. Events arrive from
// the durable channel (cluster mode) or as the `tasking.order_status` broker event, both through
// mixins/order-status-intake.mixin.ts, or through the `publish` action (acknowledged). All
// validate the event, record a rejected one in `delivery_rejected_events`
// (rejected-events.mixin.ts), and hand the valid ones to a micro-batcher (`this.intake`), which
// writes each batch in one transaction (event-writes.ts): one message per new event_id, one
// delivery per subscribed webhook. A delivery is leased to this instance in that same insert when
// the worker has room, so it goes straight to the send loop without a claim. Each customer's
// subscribed webhooks are kept between batches (lib/subscriber-cache.ts), dropped on every
// webhooks.* change and whenever this node may have missed one.
import crypto from "node:crypto";
import { Errors, type Context } from "moleculer";
import type { Knex } from "knex";
import { z } from "zod";
import { isPostgres, nowIso } from "../db.mixin";
import { validationError, zodParams } from "../validation";
import { invalidField, isDependencyFailure } from "../../lib/errors";
import { ORDER_STATUS_CHANNEL } from "../../lib/intake-channel";
import { timeOrderedUuid } from "../../lib/ids";
import { currentTraceContext } from "../../lib/tracing";
import { inSqliteTransaction } from "../../lib/sqlite-statements";
import { chunks } from "../../lib/sql-rows";
import { TASKING_ORDER_STATUS_TOPIC, TaskingOrderStatusEvent, withEventId } from "../../lib/schemas/events";
import { WEBHOOK_EVENTS } from "../../lib/schemas/webhooks";
import { orderStatusMessage, type PublishResult } from "../../lib/schemas/deliveries";
import { inOccurrenceOrder, orderKeyFor } from "../../lib/order-queues";
import { insertEventsPostgres, insertEventsSqlite, queuesOf, type WrittenEvents } from "./event-writes";
import {
	ROWS_PER_STATEMENT,
	type DispatcherMixin,
	type DispatcherThis,
	type EventSource,
	type IntakeItem,
	type LeasedDelivery,
	type MessageRow,
	type NewDeliveryRow,
	lookUpSubscribers,
} from "./shared";

/** Every change to a customer's webhooks is announced with the customer's id. */
function forgetCustomerOnChange(this: DispatcherThis, ctx: Context<{ customerId?: unknown }>): void {
	const customerId = ctx.params?.customerId;
	if (typeof customerId === "string") this.subscribers.forget(customerId);
	else this.subscribers.clear();
}

/** A webhooks.* announcement may have been missed: while this node was cut off, or by a peer that was. */
function forgetAllSubscribers(this: DispatcherThis): void {
	this.subscribers.clear();
}

export const IntakeMixin: DispatcherMixin = {
	events: {
		[WEBHOOK_EVENTS.created]: forgetCustomerOnChange,
		[WEBHOOK_EVENTS.updated]: forgetCustomerOnChange,
		[WEBHOOK_EVENTS.removed]: forgetCustomerOnChange,
		[WEBHOOK_EVENTS.rotated]: forgetCustomerOnChange,
		[WEBHOOK_EVENTS.disabled]: forgetCustomerOnChange,
		"$transporter.connected": forgetAllSubscribers,
		"$node.connected": forgetAllSubscribers,
		"$node.disconnected": forgetAllSubscribers,
	},

	actions: {
		/**
		 * Acknowledged intake for a caller that wants the outcome: answers once the message and
		 * its deliveries are persisted, and once the notifier has the event too (through the
		 * durable channel in cluster mode, in-process in the embedded mode). An invalid event is
		 * recorded as rejected and answered with 422.
		 */
		publish: {
			visibility: "public",
			// Checked in the handler, so that a rejected payload is recorded before the 422.
			params: zodParams(z.unknown()),
			async handler(this: DispatcherThis, ctx: Context<unknown>): Promise<PublishResult> {
				// One id for both consumers, so that either one recognises a repeat.
				const event = withEventId(ctx.params, timeOrderedUuid);
				const result = await this.acceptEvent(event, "publish", ctx);
				await this.handToNotifier(event, ctx);
				return result;
			},
		},
	},

	methods: {
		/** See mixins/order-status-intake.mixin.ts: persists, or records a rejection; throws only on a dependency failure. */
		async ingestOrderStatus(this: DispatcherThis, payload: unknown, source: EventSource, ctx?: Context): Promise<void> {
			try {
				await this.acceptEvent(payload, source, ctx);
			} catch (err) {
				// A rejection was recorded before the client error was thrown: nothing to redo.
				if (err instanceof Errors.MoleculerClientError) return;
				throw err;
			}
		},

		/**
		 * The notifier consumes the same events on its own. In cluster mode the channel keeps the
		 * event for its group (ours sees a repeat and skips it). Embedded, the notifier is in this
		 * process or nowhere: it is called rather than sent an event, because an event handler's
		 * failure never reaches the emitter, and publish would then answer for an email it lost.
		 */
		async handToNotifier(this: DispatcherThis, event: unknown, ctx: Context): Promise<void> {
			const send = (this.broker as { sendToChannel?: (channel: string, payload: unknown) => Promise<void> }).sendToChannel;
			if (send) await send.call(this.broker, ORDER_STATUS_CHANNEL, event);
			else if (this.broker.getLocalService("notifier")) await ctx.call("notifier.accept", event);
		},

		/** Validates, resolves the customer and hands the event to the batched writer. */
		async acceptEvent(this: DispatcherThis, payload: unknown, source: EventSource, ctx?: Context): Promise<PublishResult> {
			const parsed = TaskingOrderStatusEvent.safeParse(payload);
			if (!parsed.success) {
				const error = validationError(parsed.error);
				const problems = (error.data as Array<{ path: string; message: string }>).map(p => `${p.path || "(event)"}: ${p.message}`).join("; ");
				await this.recordRejection(source, payload, problems);
				throw error;
			}
			const event = parsed.data;
			let customerId = event.customer_id;
			if (!customerId) {
				try {
					const user: { customer_id: string } = await (ctx ?? this.broker).call("users.get", { userId: event.user_id });
					customerId = user.customer_id;
				} catch (err) {
					// Only the users service saying "no such user" makes the event invalid. Moleculer's
					// ServiceNotFoundError (users not discovered yet, or down) is a 404 too, but it is a
					// dependency failure: redeliver or retry, never reject a valid event for it.
					if ((err as { code?: number }).code !== 404 || isDependencyFailure(err)) throw err;
					await this.recordRejection(source, payload, `user_id: unknown user "${event.user_id}" and no customer_id given`);
					throw invalidField("user_id", "is not a known user, and no customer_id was given");
				}
			}
			const occurredAt = event.occurred_at ? new Date(event.occurred_at).toISOString() : nowIso();
			return this.intake.add({
				eventId: (event.event_id ?? timeOrderedUuid()).toLowerCase(),
				customerId,
				userId: event.user_id,
				type: TASKING_ORDER_STATUS_TOPIC,
				body: orderStatusMessage(event, TASKING_ORDER_STATUS_TOPIC, occurredAt),
				occurredAt,
				orderId: event.order_id,
				traceContext: currentTraceContext(),
			});
		},

		/**
		 * PostgreSQL: ANALYZE of the tables intake writes whose statistics count fewer rows than this
		 * instance has written (lib/young-table-statistics.ts says why). A failure only costs plans.
		 */
		async analyzeYoungTables(this: DispatcherThis, rowsWritten: number): Promise<void> {
			try {
				const { rows } = await this.db.raw<{ rows: Array<{ relname: string; reltuples: number }> }>(
					"SELECT relname, reltuples FROM pg_class WHERE oid IN (to_regclass('deliveries'), to_regclass('delivery_messages'))",
				);
				const young = rows.filter(row => Number(row.reltuples) < rowsWritten).map(row => row.relname);
				if (young.length > 0) await this.db.raw(`ANALYZE ${young.join(", ")}`);
			} catch (err) {
				this.logger.warn(`Could not analyze the delivery tables after ${rowsWritten} rows; their plans stay as they are: ${(err as Error).message}`);
			}
		},

		/**
		 * One transaction for a batch of events: new messages (a repeated event_id is skipped),
		 * then one delivery per subscribed webhook, leased to this instance when it has room.
		 */
		async persistEvents(this: DispatcherThis, items: IntakeItem[]): Promise<PublishResult[]> {
			const customers = [...new Set(items.map(item => item.customerId))];
			const subscriberLists = await Promise.all(
				customers.map(customerId =>
					this.subscribers.get(customerId, () => lookUpSubscribers(this.broker, customerId, TASKING_ORDER_STATUS_TOPIC)),
				),
			);
			const subscribersOf = new Map(customers.map((customerId, i) => [customerId, subscriberLists[i].value]));

			const now = nowIso();
			const leaseId = crypto.randomUUID();
			const leaseExpiresAt = Date.now() + this.config.DELIVERY_LEASE;
			const leaseExpiry = new Date(leaseExpiresAt).toISOString();
			const firstOfEvent = new Map<string, IntakeItem>();
			for (const item of inOccurrenceOrder(items)) if (!firstOfEvent.has(item.eventId)) firstOfEvent.set(item.eventId, item);

			// Every delivery is planned (and leased when the worker has room) before the write; those
			// of an event that turns out to be a repeat are dropped again after it.
			const messages: MessageRow[] = [];
			const deliveryRows: NewDeliveryRow[] = [];
			const planned: Array<{ id: string; eventId: string; webhookId: string; delivery?: LeasedDelivery }> = [];
			for (const item of firstOfEvent.values()) {
				messages.push({ event_id: item.eventId, customer_id: item.customerId, user_id: item.userId, type: item.type, body: item.body, occurred_at: item.occurredAt, created_at: now, trace_context: item.traceContext });
				for (const subscriber of subscribersOf.get(item.customerId) ?? []) {
					const id = timeOrderedUuid();
					const orderKey = orderKeyFor(subscriber.ordering, item.orderId);
					const lease = !this.stopping && this.takeLease(subscriber.id);
					const delivery = lease ? { id, webhookId: subscriber.id, body: item.body, leaseId, leaseExpiresAt, attemptCount: 0, firstAttemptAt: null, manualRetry: false, orderKey, traceContext: item.traceContext } : undefined;
					planned.push({ id, eventId: item.eventId, webhookId: subscriber.id, delivery });
					deliveryRows.push({
						id,
						event_id: item.eventId,
						webhook_id: subscriber.id,
						customer_id: item.customerId,
						status: "pending",
						next_attempt_at: lease ? leaseExpiry : now,
						lease_id: lease ? leaseId : null,
						order_key: orderKey,
						created_at: now,
						updated_at: now,
					});
				}
			}
			let written: WrittenEvents;
			try {
				written = await this.writeEvents(messages, deliveryRows);
			} catch (err) {
				for (const { delivery } of planned) if (delivery) this.releaseHold(delivery.webhookId);
				throw err;
			}
			const { inserted, waiting } = written;
			this.tableStatistics?.noteWritten(deliveryRows.length);
			const deliveriesOf = new Map<string, number>();
			for (const eventId of inserted) deliveriesOf.set(eventId, 0);
			const leased: LeasedDelivery[] = [];
			// Rows left unleased wait for a claim, and their webhook waits with them (no new row of it
			// is leased before they are). A refill is worth running now only for a webhook with half
			// its share free; one holding more is refilled as it crosses half (see releaseHold).
			let leftForClaims = false;
			for (const { id, eventId, webhookId, delivery } of planned) {
				if (!inserted.has(eventId)) {
					if (delivery) this.releaseHold(delivery.webhookId);
					continue;
				}
				deliveriesOf.set(eventId, deliveriesOf.get(eventId)! + 1);
				// It waits behind an earlier status of its order, which sets it going when it ends.
				if (waiting.has(id)) {
					if (delivery) this.releaseHold(delivery.webhookId);
					continue;
				}
				if (delivery) leased.push(delivery);
				// An open breaker: the row waits for the webhook's next probe (a claim at a poll).
				else if (this.breakers.isOpen(webhookId)) continue;
				else {
					this.waitingWebhooks.add(webhookId);
					this.unleasedAt.set(webhookId, this.claimSeq + 1);
					leftForClaims = true;
					if (this.wantsRefill(webhookId)) this.refills.add(webhookId);
				}
			}
			if (leftForClaims) this.claimSeq += 1;

			// Freshly loaded lists refresh the worker's targets; a cached one would only prolong them.
			for (const { value: subscribers, loaded } of subscriberLists) if (loaded) this.cacheSubscriberTargets(subscribers);
			for (const delivery of leased) this.enqueue(delivery);
			if (this.refills.size > 0) this.claimSoon();
			this.pump();
			if (written.promoted > 0) this.requestClaim();
			if (waiting.size > 0) void this.promoteHeadless(queuesOf(deliveryRows, waiting));

			const answered = new Set<string>();
			return items.map(item => {
				const first = !answered.has(item.eventId) && deliveriesOf.has(item.eventId);
				answered.add(item.eventId);
				return { event_id: item.eventId, duplicate: !first, deliveries: first ? deliveriesOf.get(item.eventId)! : 0 };
			});
		},

		// ---- hot writes (event-writes.ts): one synchronous transaction on SQLite, one prepared statement on PostgreSQL

		/**
		 * Writes the messages whose event_id is new and the deliveries of those, atomically; returns
		 * the event_ids that were new and the deliveries that wait behind their order's head. PostgreSQL: one prepared statement whatever the batch size.
		 * SQLite: one transaction, which also writes the results waiting for their own batch.
		 */
		async writeEvents(this: DispatcherThis, messages: MessageRow[], deliveries: NewDeliveryRow[]): Promise<WrittenEvents> {
			if (!isPostgres(this.db)) {
				// Results waiting for their batch ride along: one commit for both.
				const results = this.takeWaitingResults();
				try {
					const inserted = await inSqliteTransaction(this.db, connection => {
						const newEvents = insertEventsSqlite(connection, messages, deliveries, nowIso());
						results?.write(connection);
						return newEvents;
					});
					results?.committed();
					return inserted;
				} catch (err) {
					results?.failed(err);
					throw err;
				}
			}
			return insertEventsPostgres(this.db, messages, deliveries);
		},

		/** Within a caller's transaction (lifecycle's webhook:disabled notice): inserts the new messages; returns their event_ids. */
		async insertMessages(this: DispatcherThis, trx: Knex.Transaction, rows: MessageRow[]): Promise<Set<string>> {
			const inserted = new Set<string>();
			for (const batch of chunks(rows, ROWS_PER_STATEMENT)) {
				const returned: Array<{ event_id: string }> = await trx("delivery_messages").insert(batch).onConflict("event_id").ignore().returning("event_id");
				for (const row of returned) inserted.add(row.event_id);
			}
			return inserted;
		},

		async insertDeliveries(this: DispatcherThis, trx: Knex.Transaction, rows: NewDeliveryRow[]): Promise<void> {
			for (const batch of chunks(rows, ROWS_PER_STATEMENT)) await trx("deliveries").insert(batch);
		},
	},
};
