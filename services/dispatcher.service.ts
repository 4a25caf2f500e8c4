// dispatcher: owns webhook delivery (tables `delivery_messages`, `deliveries`,
// `delivery_attempts`, `delivery_rejected_events`). It takes in `tasking.order_status` events,
// persists one message per event and one delivery per subscribed webhook before any request is
// made, sends them through lib/webhook-sender.ts, retries failures on the persisted schedule of
// lib/retry-schedule.ts, and serves the webhook test and the delivery log.
//
// How a delivery moves:
//   intake   events arriving together are written in one transaction; each new delivery is
//            leased to this instance in that same insert and handed straight to the worker.
//   worker   sends within the global and per-webhook concurrency limits; results are written
//            back in batches (deliveries updated and attempts inserted in one transaction).
//   claims   a poll loop leases due deliveries (retries, overflow, other instances' expired
//            leases). A lease is the row's next_attempt_at moved to the lease expiry plus a
//            lease_id: an abandoned lease simply makes the row due again, and a result write
//            must match the lease_id, so a stale worker cannot overwrite a newer attempt.
//            PostgreSQL claims with FOR UPDATE SKIP LOCKED; SQLite has a single writer.
import crypto from "node:crypto";
import { Errors, type Context, type ServiceSchema, type ServiceSettingSchema } from "moleculer";
import type { Knex } from "knex";
import { z } from "zod";
import { DbMixin, isPostgres, nowIso, type DbServiceThis } from "../mixins/db.mixin";
import { DispatcherBacklogMixin } from "../mixins/backlog.mixin";
import { DispatcherOperatorMixin } from "../mixins/dispatcher-operator.mixin";
import { validationError, zodParams } from "../mixins/validation";
import { dispatcherMigrations } from "../migrations/dispatcher";
import { invalidField, NotFoundError } from "../lib/errors";
import { retryOnDependencyFailure } from "../lib/dependency-retry";
import { buildPage, decodeCursor } from "../lib/pagination";
import { MicroBatcher } from "../lib/micro-batcher";
import { timeOrderedUuid } from "../lib/ids";
import { sqliteBoolean, sqliteConnectionOf } from "../lib/sqlite-statements";
import { scheduleNextAttempt } from "../lib/retry-schedule";
import { counter, histogram } from "../lib/metrics";
import { WebhookSender, type DeliveryOutcome } from "../lib/webhook-sender";
import { TASKING_ORDER_STATUS_EVENT, TASKING_ORDER_STATUS_TOPIC, TaskingOrderStatusEvent } from "../lib/schemas/events";
import type { ResolvedWebhook, Subscriber, WebhookView } from "../lib/schemas/webhooks";
import {
	DeliveryParams,
	ListDeliveriesParams,
	TestWebhookParams,
	messageIdOf,
	orderStatusMessage,
	type Attempt,
	type Delivery,
	type DeliveryStatus,
	type DeliveryWithAttempts,
	type PublishResult,
	type WebhookTestOutcome,
} from "../lib/schemas/deliveries";

const DELIVERIES_PATH = (webhookId: string) => `/id/v3/webhooks/${webhookId}/deliveries`;
const TEST_EVENT_TYPE = "webhook:test";

// A worker may hold (queued + in flight) this many leases per unit of concurrency, so that the
// next request can start the moment one finishes, without holding leases it cannot serve soon.
const LEASE_BUFFER_FACTOR = 2;
// Webhook URLs and secrets are cached this long; webhooks.* events drop entries sooner. Short,
// because a broadcast can be missed while a node reconnects, and because the previous secret
// stops signing when its rotation grace ends.
const TARGET_CACHE_MS = 5_000;
// An attempt only starts if it can end (DELIVERY_TIMEOUT) this long before its lease expires,
// so no other instance can ever take the delivery over while it is in flight.
const LEASE_SAFETY_MS = 2_000;
// Parked deliveries (webhook disabled) are re-checked every this many polls, in case the
// webhooks.updated event that re-enabled it was missed (e.g. while this node reconnected).
const PARKED_RECHECK_POLLS = 30;
const MAX_CLAIM_BATCH = 500;
const MAX_INTAKE_BATCH = 500;
const MAX_RESULT_BATCH = 500;
// Results wait this long to be written together: nobody waits on them, and fewer, larger
// transactions cost the single SQLite writer much less.
const RESULT_LINGER_MS = 5;
// Rows per multi-row statement: stays far below SQLite's and PostgreSQL's bind-variable limits.
const ROWS_PER_STATEMENT = 200;
const REJECTED_EXCERPT_CHARS = 2_000;
const DEPENDENCY_RETRIES = 3;
const DEPENDENCY_RETRY_MS = 1_000;

interface MessageRow {
	event_id: string;
	customer_id: string;
	user_id: string;
	type: string;
	body: string;
	occurred_at: string;
	created_at: string;
}

interface DeliveryRow {
	id: string;
	event_id: string;
	webhook_id: string;
	customer_id: string;
	status: DeliveryStatus;
	attempt_count: number;
	next_attempt_at: string | null;
	lease_id: string | null;
	parked: boolean | number;
	manual_retry: boolean | number;
	first_attempt_at: string | null;
	last_attempt_at: string | null;
	last_status_code: number | null;
	last_error_kind: Delivery["last_error_kind"];
	created_at: string;
	updated_at: string;
	/** From delivery_messages, joined in for the log. */
	type?: string;
}

/** What intake writes; the other columns start at their defaults (0, false, null). */
type NewDeliveryRow = Pick<DeliveryRow, "id" | "event_id" | "webhook_id" | "customer_id" | "status" | "next_attempt_at" | "lease_id" | "created_at" | "updated_at">;

interface AttemptRow {
	delivery_id: string;
	attempt: number;
	attempted_at: string;
	success: boolean | number;
	status_code: number | null;
	error_kind: Attempt["error_kind"];
	title: string | null;
	detail: string;
	duration_ms: number;
	response_excerpt: string | null;
}

/** A delivery this instance holds a lease on, waiting for or in its attempt. */
interface LeasedDelivery {
	id: string;
	webhookId: string;
	body: string;
	leaseId: string;
	leaseExpiresAt: number;
	/** Attempts made before this one. */
	attemptCount: number;
	firstAttemptAt: string | null;
	manualRetry: boolean;
}

/** What a leased delivery becomes: written back with the lease as the guard. */
interface DeliveryUpdate {
	delivery: LeasedDelivery;
	status: DeliveryStatus;
	attemptCount: number;
	nextAttemptAt: string | null;
	parked: boolean;
	manualRetry: boolean;
	outcome?: DeliveryOutcome;
}

/** A webhook as the worker needs it; `null` in the cache means it no longer exists. */
type Target = Pick<ResolvedWebhook, "id" | "url" | "active" | "secrets">;

interface IntakeItem {
	eventId: string;
	customerId: string;
	userId: string;
	type: string;
	body: string;
	occurredAt: string;
}

type EventSource = "event" | "publish";

interface TenantMeta {
	customerId?: string;
}

type DispatcherThis = DbServiceThis & {
	sender: WebhookSender;
	stopping: boolean;
	intake: MicroBatcher<IntakeItem, PublishResult>;
	results: MicroBatcher<DeliveryUpdate, boolean>;
	/** Leased deliveries waiting for a free slot, per webhook (Map order gives round-robin). */
	queues: Map<string, LeasedDelivery[]>;
	inFlight: number;
	inFlightByWebhook: Map<string, number>;
	/** Leases held by the worker (queued + in flight), overall and per webhook. */
	held: number;
	heldByWebhook: Map<string, number>;
	attemptsInFlight: Set<Promise<void>>;
	targets: Map<string, { target: Target | null; expiresAt: number }>;
	resolving: Set<string>;
	claimRun: Promise<void> | null;
	/** Due rows may be waiting that the last claim did not take (capacity ran out). */
	backlog: boolean;
	pollTimer: NodeJS.Timeout | null;
	polls: number;
	metrics: {
		attempts: ReturnType<typeof counter>;
		deliveries: ReturnType<typeof counter>;
		duration: ReturnType<typeof histogram>;
	};

	receiveEvent(ctx: Context<unknown>): Promise<void>;
	acceptEvent(payload: unknown, source: EventSource, ctx: Context): Promise<PublishResult>;
	recordRejection(source: EventSource, payload: unknown, reason: string): Promise<void>;
	persistEvents(items: IntakeItem[]): Promise<PublishResult[]>;
	takeLease(webhookId: string): boolean;
	releaseHold(webhookId: string): void;
	enqueue(delivery: LeasedDelivery): void;
	pump(): void;
	freshTarget(webhookId: string): Target | null | undefined;
	cacheTarget(webhookId: string, target: Target | null): void;
	resolveTargets(webhookIds: string[]): Promise<void>;
	startAttempt(delivery: LeasedDelivery, target: Target): void;
	afterAttempt(delivery: LeasedDelivery, outcome: DeliveryOutcome): DeliveryUpdate;
	finish(delivery: LeasedDelivery, change: Omit<DeliveryUpdate, "delivery">): void;
	writeUpdates(updates: DeliveryUpdate[]): Promise<boolean[]>;
	insertMessages(trx: Knex.Transaction, rows: MessageRow[]): Promise<Set<string>>;
	insertDeliveries(trx: Knex.Transaction, rows: NewDeliveryRow[]): Promise<void>;
	updateLeased(trx: Knex.Transaction, updates: DeliveryUpdate[], now: string): Promise<Set<string>>;
	insertAttempts(trx: Knex.Transaction, rows: AttemptRow[]): Promise<void>;
	claimDue(): Promise<void>;
	claimUntilFull(): Promise<void>;
	claimBatch(limit: number): Promise<LeasedDelivery[]>;
	claimSoon(): void;
	schedulePoll(): void;
	recheckParked(): Promise<void>;
	resumeParked(webhookId: string): Promise<void>;
	cancelPending(webhookId: string): Promise<number>;
	customerOf(ctx: Context<unknown, TenantMeta>): string;
	ownedDelivery(ctx: Context<DeliveryParams, TenantMeta>): Promise<DeliveryRow>;
	present(row: DeliveryRow): Delivery;
};

const isTrue = (value: boolean | number | null | undefined) => Boolean(value);

/** knex.raw answers rows on SQLite and a pg Result on PostgreSQL. */
function rowsOf<Row>(result: unknown): Row[] {
	return Array.isArray(result) ? (result as Row[]) : ((result as { rows: Row[] }).rows ?? []);
}

function chunks<T>(items: T[], size: number): T[][] {
	const out: T[][] = [];
	for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
	return out;
}

/** PostgreSQL text cannot hold NUL characters, and a rejected payload may contain anything. */
const storable = (text: string, max: number) => text.replaceAll("\u0000", "").slice(0, max);

function excerptOf(payload: unknown): string {
	let text: string;
	try {
		text = JSON.stringify(payload) ?? String(payload);
	} catch {
		text = String(payload);
	}
	return text.length > REJECTED_EXCERPT_CHARS ? `${storable(text, REJECTED_EXCERPT_CHARS)}…` : storable(text, REJECTED_EXCERPT_CHARS);
}

const sleep = (ms: number) => new Promise(resolve => setTimeout(resolve, ms));

const DispatcherService: ServiceSchema<ServiceSettingSchema, DispatcherThis> = {
	name: "dispatcher",
	mixins: [DbMixin("dispatcher", dispatcherMigrations) as Partial<ServiceSchema>, DispatcherBacklogMixin, DispatcherOperatorMixin],

	actions: {
		/**
		 * Acknowledged intake of a tasking order status event: answers once the message and its
		 * deliveries are persisted. An invalid event is recorded as rejected and answered with 422.
		 */
		publish: {
			visibility: "public",
			// Checked in the handler, so that a rejected payload is recorded before the 422.
			params: zodParams(z.unknown()),
			async handler(this: DispatcherThis, ctx: Context<unknown>): Promise<PublishResult> {
				return this.acceptEvent(ctx.params, "publish", ctx);
			},
		},

		/** POST /webhooks/{id}/test: one signed test request, not persisted, not retried. */
		testWebhook: {
			params: zodParams(TestWebhookParams),
			async handler(this: DispatcherThis, ctx: Context<TestWebhookParams, TenantMeta>): Promise<WebhookView & WebhookTestOutcome> {
				const webhook: WebhookView = await ctx.call("webhooks.find", { id: ctx.params.id });
				const [target]: ResolvedWebhook[] = await ctx.call("webhooks.resolve", { ids: [webhook.id] });
				if (!target) throw new NotFoundError("Webhook");
				const body = JSON.stringify({
					type: TEST_EVENT_TYPE,
					timestamp: nowIso(),
					data: { webhook_id: webhook.id, webhook_name: webhook.name, message: "This is a test event. Answer 200 OK to pass the test." },
				});
				const outcome = await this.sender.send({
					url: target.url,
					messageId: messageIdOf(crypto.randomUUID()),
					body,
					secrets: target.secrets,
					timeoutMs: this.config.WEBHOOK_TEST_TIMEOUT,
				});
				return {
					...webhook,
					success: outcome.success,
					status_code: outcome.statusCode,
					title: outcome.title,
					detail: outcome.success ? "The URL answered 200 OK" : outcome.detail,
				};
			},
		},

		/** GET /webhooks/{id}/deliveries: newest first, keyset-paged, optionally by status. */
		listDeliveries: {
			params: zodParams(ListDeliveriesParams),
			async handler(this: DispatcherThis, ctx: Context<ListDeliveriesParams, TenantMeta>) {
				const customerId = this.customerOf(ctx);
				const { id, status, per_page: perPage, token } = ctx.params;
				const cursor = decodeCursor(token);
				await ctx.call("webhooks.find", { id });

				const matching = (query: Knex.QueryBuilder) => {
					query.where({ "d.webhook_id": id, "d.customer_id": customerId });
					if (status) query.andWhere("d.status", status);
					return query;
				};
				const [{ count }] = await matching(this.db("deliveries as d")).count({ count: "*" });
				let query = matching(this.db("deliveries as d"))
					.join("delivery_messages as m", "m.event_id", "d.event_id")
					.select("d.*", "m.type")
					.orderBy([
						{ column: "d.created_at", order: "desc" },
						{ column: "d.id", order: "desc" },
					])
					.limit(perPage + 1);
				if (cursor) {
					query = query.andWhere(before =>
						before.where("d.created_at", "<", cursor.at).orWhere(tie => tie.where("d.created_at", "=", cursor.at).andWhere("d.id", "<", cursor.id)),
					);
				}
				const rows: DeliveryRow[] = await query;
				const statusQuery = status ? `&status=${status}` : "";
				const page = buildPage(
					rows,
					perPage,
					Number(count),
					row => ({ at: row.created_at, id: row.id }),
					row => this.present(row),
					next => `${DELIVERIES_PATH(id)}?per_page=${perPage}${statusQuery}&token=${encodeURIComponent(next)}`,
				);
				return { deliveries: page.items, context: page.context, links: page.links };
			},
		},

		/** GET /webhooks/{id}/deliveries/{delivery_id}: the delivery, its payload and its attempts. */
		getDelivery: {
			params: zodParams(DeliveryParams),
			async handler(this: DispatcherThis, ctx: Context<DeliveryParams, TenantMeta>): Promise<DeliveryWithAttempts> {
				const row = await this.ownedDelivery(ctx);
				const message: Pick<MessageRow, "body"> = await this.db("delivery_messages").where({ event_id: row.event_id }).first("body");
				const attempts: AttemptRow[] = await this.db("delivery_attempts").where({ delivery_id: row.id }).orderBy([{ column: "attempt" }, { column: "id" }]);
				return {
					...this.present(row),
					payload: JSON.parse(message.body) as unknown,
					// Never the response body: the log must not become a way to read other servers.
					attempts: attempts.map(attempt => ({
						attempt: attempt.attempt,
						attempted_at: attempt.attempted_at,
						success: isTrue(attempt.success),
						status_code: attempt.status_code,
						error_kind: attempt.error_kind,
						title: attempt.title,
						detail: attempt.detail,
						duration_ms: attempt.duration_ms,
					})),
				};
			},
		},

		/**
		 * POST /webhooks/{id}/deliveries/{delivery_id}/retry (202): an attempt as soon as possible.
		 * A pending delivery just becomes due now. A finished one gets one more attempt, without
		 * automatic retries after it. One already being attempted is left as it is.
		 */
		retryDelivery: {
			params: zodParams(DeliveryParams),
			async handler(this: DispatcherThis, ctx: Context<DeliveryParams, TenantMeta>): Promise<Delivery> {
				const row = await this.ownedDelivery(ctx);
				const now = nowIso();
				if (row.status === "pending") {
					// Not while a lease is live: that would let a second worker attempt it concurrently.
					await this.db("deliveries")
						.where({ id: row.id, status: "pending" })
						.andWhere(free => free.whereNull("lease_id").orWhere("next_attempt_at", "<=", now).orWhereNull("next_attempt_at"))
						.update({ next_attempt_at: now, parked: false, lease_id: null, updated_at: now });
				} else {
					await this.db("deliveries")
						.where({ id: row.id, status: row.status })
						.update({ status: "pending", manual_retry: true, next_attempt_at: now, parked: false, lease_id: null, updated_at: now });
				}
				this.claimSoon();
				return this.present((await this.ownedDelivery(ctx)) as DeliveryRow);
			},
		},
	},

	events: {
		[TASKING_ORDER_STATUS_EVENT]: {
			// Never throws: a bad or undeliverable event is logged (and recorded), not retried.
			async handler(this: DispatcherThis, ctx: Context<unknown>) {
				await this.receiveEvent(ctx);
			},
		},

		"webhooks.updated": {
			async handler(this: DispatcherThis, ctx: Context<{ id?: unknown; active?: unknown }>) {
				const { id, active } = ctx.params ?? {};
				if (typeof id !== "string") return;
				this.targets.delete(id);
				if (active === true) await this.resumeParked(id).catch(err => this.logger.error(`Could not resume deliveries of webhook ${id}`, err));
			},
		},

		"webhooks.removed": {
			async handler(this: DispatcherThis, ctx: Context<{ id?: unknown }>) {
				const id = ctx.params?.id;
				if (typeof id !== "string") return;
				this.cacheTarget(id, null);
				const cancelled = await this.cancelPending(id).catch(err => {
					this.logger.error(`Could not cancel deliveries of removed webhook ${id}`, err);
					return 0;
				});
				if (cancelled) this.logger.info(`Webhook ${id} removed: ${cancelled} pending deliveries cancelled`);
				this.pump();
			},
		},

		"webhooks.rotated": {
			handler(this: DispatcherThis, ctx: Context<{ id?: unknown }>) {
				const id = ctx.params?.id;
				if (typeof id === "string") this.targets.delete(id);
			},
		},
	},

	methods: {
		// ---- intake -------------------------------------------------------------------------

		async receiveEvent(this: DispatcherThis, ctx: Context<unknown>): Promise<void> {
			try {
				await retryOnDependencyFailure(() => this.acceptEvent(ctx.params, "event", ctx), {
					attempts: DEPENDENCY_RETRIES,
					delayMs: DEPENDENCY_RETRY_MS,
					stopping: () => this.stopping,
				});
			} catch (err) {
				if (err instanceof Errors.MoleculerClientError) return; // rejected: already logged and recorded
				this.logger.error(`A ${TASKING_ORDER_STATUS_EVENT} event could not be processed and is lost`, err);
			}
		},

		/** Validates, resolves the customer and hands the event to the batched writer. */
		async acceptEvent(this: DispatcherThis, payload: unknown, source: EventSource, ctx: Context): Promise<PublishResult> {
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
					const user: { customer_id: string } = await ctx.call("users.get", { userId: event.user_id });
					customerId = user.customer_id;
				} catch (err) {
					if ((err as { code?: number }).code !== 404) throw err;
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
			});
		},

		async recordRejection(this: DispatcherThis, source: EventSource, payload: unknown, reason: string): Promise<void> {
			const eventId = payload && typeof payload === "object" ? (payload as { event_id?: unknown }).event_id : undefined;
			this.logger.warn(`Rejected a ${TASKING_ORDER_STATUS_EVENT} event (${source}): ${reason}`);
			try {
				await this.db("delivery_rejected_events").insert({
					source,
					event_id: typeof eventId === "string" ? storable(eventId, 100) : null,
					reason: storable(reason, 1000),
					excerpt: excerptOf(payload),
					received_at: nowIso(),
				});
			} catch (err) {
				this.logger.error("Could not record a rejected event", err);
			}
		},

		/**
		 * One transaction for a batch of events: new messages (a repeated event_id is skipped),
		 * then one delivery per subscribed webhook, leased to this instance when it has room.
		 */
		async persistEvents(this: DispatcherThis, items: IntakeItem[]): Promise<PublishResult[]> {
			const customers = [...new Set(items.map(item => item.customerId))];
			const subscriberLists = await Promise.all(
				customers.map(customerId => this.broker.call<Subscriber[], { customerId: string; topic: string }>("webhooks.subscribers", { customerId, topic: TASKING_ORDER_STATUS_TOPIC })),
			);
			const subscribersOf = new Map(customers.map((customerId, i) => [customerId, subscriberLists[i]]));

			const now = nowIso();
			const leaseId = crypto.randomUUID();
			const leaseExpiresAt = Date.now() + this.config.DELIVERY_LEASE;
			const leaseExpiry = new Date(leaseExpiresAt).toISOString();
			const firstOfEvent = new Map<string, IntakeItem>();
			for (const item of items) if (!firstOfEvent.has(item.eventId)) firstOfEvent.set(item.eventId, item);

			const deliveriesOf = new Map<string, number>();
			const leased: LeasedDelivery[] = [];
			let unleased = 0;
			try {
				await this.db.transaction(async trx => {
					const inserted = await this.insertMessages(
						trx,
						[...firstOfEvent.values()].map(item => ({
							event_id: item.eventId,
							customer_id: item.customerId,
							user_id: item.userId,
							type: item.type,
							body: item.body,
							occurred_at: item.occurredAt,
							created_at: now,
						})),
					);

					const deliveryRows: NewDeliveryRow[] = [];
					for (const item of firstOfEvent.values()) {
						if (!inserted.has(item.eventId)) continue;
						const subscribers = subscribersOf.get(item.customerId) ?? [];
						deliveriesOf.set(item.eventId, subscribers.length);
						for (const subscriber of subscribers) {
							const id = timeOrderedUuid();
							const lease = !this.stopping && this.takeLease(subscriber.id);
							if (lease) leased.push({ id, webhookId: subscriber.id, body: item.body, leaseId, leaseExpiresAt, attemptCount: 0, firstAttemptAt: null, manualRetry: false });
							else unleased += 1;
							deliveryRows.push({
								id,
								event_id: item.eventId,
								webhook_id: subscriber.id,
								customer_id: item.customerId,
								status: "pending",
								next_attempt_at: lease ? leaseExpiry : now,
								lease_id: lease ? leaseId : null,
								created_at: now,
								updated_at: now,
							});
						}
					}
					await this.insertDeliveries(trx, deliveryRows);
				});
			} catch (err) {
				for (const delivery of leased) this.releaseHold(delivery.webhookId);
				throw err;
			}

			for (const subscribers of subscriberLists) {
				for (const subscriber of subscribers) this.cacheTarget(subscriber.id, { id: subscriber.id, url: subscriber.url, active: true, secrets: subscriber.secrets });
			}
			for (const delivery of leased) this.enqueue(delivery);
			if (unleased > 0) {
				this.backlog = true;
				this.claimSoon();
			}
			this.pump();

			const answered = new Set<string>();
			return items.map(item => {
				const first = !answered.has(item.eventId) && deliveriesOf.has(item.eventId);
				answered.add(item.eventId);
				return { event_id: item.eventId, duplicate: !first, deliveries: first ? deliveriesOf.get(item.eventId)! : 0 };
			});
		},

		// ---- worker -------------------------------------------------------------------------

		/** Takes a local lease slot if this instance has room for one more delivery of the webhook. */
		takeLease(this: DispatcherThis, webhookId: string): boolean {
			const perWebhook = this.heldByWebhook.get(webhookId) ?? 0;
			if (this.held >= this.config.DELIVERY_CONCURRENCY * LEASE_BUFFER_FACTOR) return false;
			if (perWebhook >= this.config.DELIVERY_WEBHOOK_CONCURRENCY * LEASE_BUFFER_FACTOR) return false;
			this.held += 1;
			this.heldByWebhook.set(webhookId, perWebhook + 1);
			return true;
		},

		releaseHold(this: DispatcherThis, webhookId: string): void {
			this.held -= 1;
			const left = (this.heldByWebhook.get(webhookId) ?? 1) - 1;
			if (left > 0) this.heldByWebhook.set(webhookId, left);
			else this.heldByWebhook.delete(webhookId);
		},

		enqueue(this: DispatcherThis, delivery: LeasedDelivery): void {
			const queue = this.queues.get(delivery.webhookId);
			if (queue) queue.push(delivery);
			else this.queues.set(delivery.webhookId, [delivery]);
		},

		/** Starts as many queued attempts as the concurrency limits allow, webhooks taking turns. */
		pump(this: DispatcherThis): void {
			if (this.stopping) return;
			const globalLimit = this.config.DELIVERY_CONCURRENCY;
			const webhookLimit = this.config.DELIVERY_WEBHOOK_CONCURRENCY;
			const unresolved: string[] = [];
			let started = true;
			while (started && this.inFlight < globalLimit && this.queues.size > 0) {
				started = false;
				for (const webhookId of [...this.queues.keys()]) {
					if (this.inFlight >= globalLimit) break;
					const queue = this.queues.get(webhookId)!;
					if ((this.inFlightByWebhook.get(webhookId) ?? 0) >= webhookLimit) continue;
					const target = this.freshTarget(webhookId);
					if (target === undefined) {
						if (!this.resolving.has(webhookId) && !unresolved.includes(webhookId)) unresolved.push(webhookId);
						continue;
					}
					if (target === null || !target.active) {
						// Deleted: cancelled. Disabled: parked until it is enabled again (not an attempt).
						this.queues.delete(webhookId);
						for (const delivery of queue) {
							this.finish(delivery, target === null
								? { status: "cancelled", attemptCount: delivery.attemptCount, nextAttemptAt: null, parked: false, manualRetry: false }
								: { status: "pending", attemptCount: delivery.attemptCount, nextAttemptAt: null, parked: true, manualRetry: delivery.manualRetry });
						}
						continue;
					}
					const delivery = queue.shift()!;
					// Rotate this webhook to the back, so that a busy one cannot starve the others.
					this.queues.delete(webhookId);
					if (queue.length > 0) this.queues.set(webhookId, queue);
					if (Date.now() + this.config.DELIVERY_TIMEOUT + LEASE_SAFETY_MS > delivery.leaseExpiresAt) {
						// Waited too long: the attempt could outlive the lease. Give the row back.
						this.finish(delivery, { status: "pending", attemptCount: delivery.attemptCount, nextAttemptAt: nowIso(), parked: false, manualRetry: delivery.manualRetry });
					} else {
						this.startAttempt(delivery, target);
					}
					started = true;
				}
			}
			if (unresolved.length > 0) void this.resolveTargets(unresolved);
		},

		freshTarget(this: DispatcherThis, webhookId: string): Target | null | undefined {
			const cached = this.targets.get(webhookId);
			if (!cached) return undefined;
			if (cached.expiresAt < Date.now()) {
				this.targets.delete(webhookId);
				return undefined;
			}
			return cached.target;
		},

		cacheTarget(this: DispatcherThis, webhookId: string, target: Target | null): void {
			this.targets.set(webhookId, { target, expiresAt: Date.now() + TARGET_CACHE_MS });
		},

		/** One webhooks.resolve call for every webhook the worker needs and has not cached. */
		async resolveTargets(this: DispatcherThis, webhookIds: string[]): Promise<void> {
			for (const id of webhookIds) this.resolving.add(id);
			let retryLater = false;
			try {
				for (const ids of chunks(webhookIds, 1000)) {
					const found = await this.broker.call<ResolvedWebhook[], { ids: string[] }>("webhooks.resolve", { ids });
					const byId = new Map(found.map(webhook => [webhook.id, webhook]));
					for (const id of ids) {
						const webhook = byId.get(id);
						this.cacheTarget(id, webhook ? { id, url: webhook.url, active: webhook.active, secrets: webhook.secrets } : null);
					}
				}
			} catch (err) {
				this.logger.warn(`Could not look up webhooks for delivery, will try again: ${(err as Error).message}`);
				retryLater = true;
			} finally {
				for (const id of webhookIds) this.resolving.delete(id);
			}
			if (retryLater) setTimeout(() => this.pump(), DEPENDENCY_RETRY_MS).unref();
			else this.pump();
		},

		startAttempt(this: DispatcherThis, delivery: LeasedDelivery, target: Target): void {
			this.inFlight += 1;
			this.inFlightByWebhook.set(delivery.webhookId, (this.inFlightByWebhook.get(delivery.webhookId) ?? 0) + 1);
			const attempt = this.sender
				.send({ url: target.url, messageId: messageIdOf(delivery.id), body: delivery.body, secrets: target.secrets, timeoutMs: this.config.DELIVERY_TIMEOUT })
				.then(outcome => {
					const update = this.afterAttempt(delivery, outcome);
					this.finish(delivery, update);
				})
				.catch(err => {
					// The sender reports network trouble as outcomes; this is a bug. The lease will expire
					// and the delivery will be attempted again.
					this.logger.error(`Attempt of delivery ${delivery.id} failed unexpectedly`, err);
				})
				.finally(() => {
					this.inFlight -= 1;
					const left = (this.inFlightByWebhook.get(delivery.webhookId) ?? 1) - 1;
					if (left > 0) this.inFlightByWebhook.set(delivery.webhookId, left);
					else this.inFlightByWebhook.delete(delivery.webhookId);
					this.attemptsInFlight.delete(attempt);
					this.pump();
				});
			this.attemptsInFlight.add(attempt);
		},

		/** Decides what an attempt's outcome means for the delivery: done, retry at, or failed. */
		afterAttempt(this: DispatcherThis, delivery: LeasedDelivery, outcome: DeliveryOutcome): DeliveryUpdate {
			const attemptCount = delivery.attemptCount + 1;
			const result = outcome.success ? "succeeded" : "failed";
			this.metrics.attempts.inc({ result });
			this.metrics.duration.observe({ result }, outcome.durationMs / 1000);
			if (outcome.success) {
				this.metrics.deliveries.inc({ status: "succeeded" });
				return { delivery, status: "succeeded", attemptCount, nextAttemptAt: null, parked: false, manualRetry: false, outcome };
			}
			const next = delivery.manualRetry
				? null
				: scheduleNextAttempt({
						firstAttemptAt: new Date(delivery.firstAttemptAt ?? outcome.attemptedAt),
						attemptsMade: attemptCount,
						offsets: this.config.DELIVERY_RETRY_SCHEDULE,
						now: new Date(),
					});
			if (!next) {
				this.metrics.deliveries.inc({ status: "failed" });
				this.logger.info(`Delivery ${delivery.id} failed after ${attemptCount} attempt(s): ${outcome.detail}`);
				return { delivery, status: "failed", attemptCount, nextAttemptAt: null, parked: false, manualRetry: false, outcome };
			}
			return { delivery, status: "pending", attemptCount, nextAttemptAt: next.toISOString(), parked: false, manualRetry: false, outcome };
		},

		/**
		 * Frees the delivery's slot and queues the write-back of its result. The slot is free at
		 * once: the row stays leased in the database until the write lands, so nobody else claims it.
		 */
		finish(this: DispatcherThis, delivery: LeasedDelivery, change: Omit<DeliveryUpdate, "delivery">): void {
			const update: DeliveryUpdate = { ...change, delivery };
			this.releaseHold(delivery.webhookId);
			// Claim in batches (not one row per finished delivery), early enough to keep every slot busy.
			const room = this.config.DELIVERY_CONCURRENCY * LEASE_BUFFER_FACTOR - this.held;
			if (this.backlog && room >= this.config.DELIVERY_CONCURRENCY / 2) this.claimSoon();
			const write = async () => {
				for (let attempt = 1; ; attempt += 1) {
					try {
						const matched = await this.results.add(update);
						if (!matched) this.logger.debug(`Delivery ${delivery.id}: lease lost before the result was written (taken over, cancelled or retried by hand)`);
						return;
					} catch (err) {
						// Past the lease the write is pointless: the row is due again and someone retries it.
						if (this.stopping || Date.now() > delivery.leaseExpiresAt) {
							this.logger.error(`Delivery ${delivery.id}: result not written; it will be attempted again once its lease expires`, err);
							return;
						}
						await sleep(DEPENDENCY_RETRY_MS * attempt);
					}
				}
			};
			void write();
		},

		/**
		 * Writes a batch of results in one transaction: one UPDATE for all deliveries (each guarded
		 * by its lease) and one INSERT for the attempts of those whose lease still held.
		 */
		async writeUpdates(this: DispatcherThis, updates: DeliveryUpdate[]): Promise<boolean[]> {
			const now = nowIso();
			let matched = new Set<string>();
			await this.db.transaction(async trx => {
				matched = await this.updateLeased(trx, updates, now);
				const attempts: AttemptRow[] = updates
					.filter(update => update.outcome && matched.has(update.delivery.id))
					.map(({ delivery, attemptCount, outcome }) => ({
						delivery_id: delivery.id,
						attempt: attemptCount,
						attempted_at: outcome!.attemptedAt,
						success: outcome!.success,
						status_code: outcome!.statusCode,
						error_kind: outcome!.errorKind,
						title: outcome!.title,
						detail: outcome!.detail.slice(0, 500),
						duration_ms: outcome!.durationMs,
						response_excerpt: outcome!.responseExcerpt,
					}));
				await this.insertAttempts(trx, attempts);
			});
			return updates.map(update => matched.has(update.delivery.id));
		},

		// ---- hot writes: one prepared statement per row on SQLite, multi-row statements on PostgreSQL

		/** Inserts the messages whose event_id is new; returns those event_ids. */
		async insertMessages(this: DispatcherThis, trx: Knex.Transaction, rows: MessageRow[]): Promise<Set<string>> {
			const inserted = new Set<string>();
			const sqlite = await sqliteConnectionOf(trx);
			if (sqlite) {
				const insert = sqlite.prepare(
					`INSERT INTO delivery_messages (event_id, customer_id, user_id, type, body, occurred_at, created_at)
					VALUES (@event_id, @customer_id, @user_id, @type, @body, @occurred_at, @created_at) ON CONFLICT (event_id) DO NOTHING`,
				);
				for (const row of rows) if (insert.run(row).changes === 1) inserted.add(row.event_id);
				return inserted;
			}
			for (const batch of chunks(rows, ROWS_PER_STATEMENT)) {
				const returned: Array<{ event_id: string }> = await trx("delivery_messages").insert(batch).onConflict("event_id").ignore().returning("event_id");
				for (const row of returned) inserted.add(row.event_id);
			}
			return inserted;
		},

		async insertDeliveries(this: DispatcherThis, trx: Knex.Transaction, rows: NewDeliveryRow[]): Promise<void> {
			const sqlite = await sqliteConnectionOf(trx);
			if (sqlite) {
				const insert = sqlite.prepare(
					`INSERT INTO deliveries (id, event_id, webhook_id, customer_id, status, next_attempt_at, lease_id, created_at, updated_at)
					VALUES (@id, @event_id, @webhook_id, @customer_id, @status, @next_attempt_at, @lease_id, @created_at, @updated_at)`,
				);
				for (const row of rows) insert.run(row);
				return;
			}
			for (const batch of chunks(rows, ROWS_PER_STATEMENT)) await trx("deliveries").insert(batch);
		},

		/**
		 * Writes each update where the delivery's lease still matches, and returns the ids that
		 * matched. A delivery whose lease was lost (cancelled, taken over) is left alone.
		 */
		async updateLeased(this: DispatcherThis, trx: Knex.Transaction, updates: DeliveryUpdate[], now: string): Promise<Set<string>> {
			const matched = new Set<string>();
			const sqlite = await sqliteConnectionOf(trx);
			if (sqlite) {
				const update = sqlite.prepare(
					`UPDATE deliveries SET
						status = @status, attempt_count = @attempt_count, next_attempt_at = @next_attempt_at,
						parked = @parked, manual_retry = @manual_retry, lease_id = NULL,
						first_attempt_at = COALESCE(first_attempt_at, @attempted_at),
						last_attempt_at = CASE WHEN @attempted = 1 THEN @attempted_at ELSE last_attempt_at END,
						last_status_code = CASE WHEN @attempted = 1 THEN @status_code ELSE last_status_code END,
						last_error_kind = CASE WHEN @attempted = 1 THEN @error_kind ELSE last_error_kind END,
						updated_at = @updated_at
					WHERE id = @id AND lease_id = @lease_id`,
				);
				for (const change of updates) {
					const result = update.run({
						id: change.delivery.id,
						lease_id: change.delivery.leaseId,
						status: change.status,
						attempt_count: change.attemptCount,
						next_attempt_at: change.nextAttemptAt,
						parked: sqliteBoolean(change.parked),
						manual_retry: sqliteBoolean(change.manualRetry),
						attempted: change.outcome ? 1 : 0,
						attempted_at: change.outcome?.attemptedAt ?? null,
						status_code: change.outcome?.statusCode ?? null,
						error_kind: change.outcome?.errorKind ?? null,
						updated_at: now,
					});
					if (result.changes === 1) matched.add(change.delivery.id);
				}
				return matched;
			}
			// One statement for the whole batch: a VALUES list joined to the rows it updates.
			for (const batch of chunks(updates, ROWS_PER_STATEMENT)) {
				const values = batch.map(() => "(?, ?, ?, CAST(? AS integer), ?, CAST(? AS integer), CAST(? AS integer), CAST(? AS integer), ?, CAST(? AS integer), ?)").join(", ");
				const bindings = batch.flatMap(change => [
					change.delivery.id,
					change.delivery.leaseId,
					change.status,
					change.attemptCount,
					change.nextAttemptAt,
					change.parked ? 1 : 0,
					change.manualRetry ? 1 : 0,
					change.outcome ? 1 : 0,
					change.outcome?.attemptedAt ?? null,
					change.outcome?.statusCode ?? null,
					change.outcome?.errorKind ?? null,
				]);
				const result = await trx.raw(
					`WITH v(id, lease_id, status, attempt_count, next_attempt_at, parked, manual_retry, attempted, attempted_at, status_code, error_kind) AS (VALUES ${values})
					UPDATE deliveries SET
						status = v.status,
						attempt_count = v.attempt_count,
						next_attempt_at = v.next_attempt_at,
						parked = (v.parked = 1),
						manual_retry = (v.manual_retry = 1),
						lease_id = NULL,
						first_attempt_at = COALESCE(deliveries.first_attempt_at, v.attempted_at),
						last_attempt_at = CASE WHEN v.attempted = 1 THEN v.attempted_at ELSE deliveries.last_attempt_at END,
						last_status_code = CASE WHEN v.attempted = 1 THEN v.status_code ELSE deliveries.last_status_code END,
						last_error_kind = CASE WHEN v.attempted = 1 THEN v.error_kind ELSE deliveries.last_error_kind END,
						updated_at = ?
					FROM v
					WHERE deliveries.id = v.id AND deliveries.lease_id = v.lease_id
					RETURNING deliveries.id`,
					[...bindings, now],
				);
				for (const row of rowsOf<{ id: string }>(result)) matched.add(row.id);
			}
			return matched;
		},

		async insertAttempts(this: DispatcherThis, trx: Knex.Transaction, rows: AttemptRow[]): Promise<void> {
			const sqlite = await sqliteConnectionOf(trx);
			if (sqlite) {
				const insert = sqlite.prepare(
					`INSERT INTO delivery_attempts (delivery_id, attempt, attempted_at, success, status_code, error_kind, title, detail, duration_ms, response_excerpt)
					VALUES (@delivery_id, @attempt, @attempted_at, @success, @status_code, @error_kind, @title, @detail, @duration_ms, @response_excerpt)`,
				);
				for (const row of rows) insert.run({ ...row, success: sqliteBoolean(Boolean(row.success)) });
				return;
			}
			for (const batch of chunks(rows, ROWS_PER_STATEMENT)) await trx("delivery_attempts").insert(batch);
		},

		// ---- claims -------------------------------------------------------------------------

		/** Leases due deliveries up to this instance's free capacity, and hands them to the worker. */
		async claimDue(this: DispatcherThis): Promise<void> {
			if (this.claimRun || this.stopping) return;
			this.claimRun = this.claimUntilFull().finally(() => {
				this.claimRun = null;
			});
			await this.claimRun;
		},

		async claimUntilFull(this: DispatcherThis): Promise<void> {
			try {
				for (;;) {
					const room = this.config.DELIVERY_CONCURRENCY * LEASE_BUFFER_FACTOR - this.held;
					if (room <= 0) {
						this.backlog = true;
						return;
					}
					const limit = Math.min(room, MAX_CLAIM_BATCH);
					const claimed = await this.claimBatch(limit);
					for (const delivery of claimed) {
						this.held += 1;
						this.heldByWebhook.set(delivery.webhookId, (this.heldByWebhook.get(delivery.webhookId) ?? 0) + 1);
						this.enqueue(delivery);
					}
					this.pump();
					if (claimed.length < limit) {
						this.backlog = false;
						return;
					}
				}
			} catch (err) {
				this.logger.error("Claiming due deliveries failed; will try again at the next poll", err);
			}
		},

		/**
		 * One claim statement. Webhooks that already fill their share of this instance's leases are
		 * left out, so one slow receiver cannot take every slot.
		 */
		async claimBatch(this: DispatcherThis, limit: number): Promise<LeasedDelivery[]> {
			const now = Date.now();
			const leaseId = crypto.randomUUID();
			const leaseExpiresAt = now + this.config.DELIVERY_LEASE;
			const saturated = [...this.heldByWebhook.entries()]
				.filter(([, count]) => count >= this.config.DELIVERY_WEBHOOK_CONCURRENCY * LEASE_BUFFER_FACTOR)
				.map(([webhookId]) => webhookId);
			const exclude = saturated.length ? `AND webhook_id NOT IN (${saturated.map(() => "?").join(", ")})` : "";
			const skipLocked = isPostgres(this.db) ? "FOR UPDATE SKIP LOCKED" : "";
			// The due rows are picked once, in a materialised CTE: PostgreSQL may re-run a plain
			// `IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED)` subquery and so claim more than n.
			const result = await this.db.raw(
				`WITH due AS MATERIALIZED (
					SELECT id FROM deliveries
					WHERE status = 'pending' AND next_attempt_at <= ? ${exclude}
					ORDER BY next_attempt_at
					LIMIT ? ${skipLocked}
				)
				UPDATE deliveries SET lease_id = ?, next_attempt_at = ?
				WHERE id IN (SELECT id FROM due)
				RETURNING id, event_id, webhook_id, attempt_count, first_attempt_at, manual_retry`,
				[new Date(now).toISOString(), ...saturated, limit, leaseId, new Date(leaseExpiresAt).toISOString()],
			);
			const rows = rowsOf<Pick<DeliveryRow, "id" | "event_id" | "webhook_id" | "attempt_count" | "first_attempt_at" | "manual_retry">>(result);
			if (rows.length === 0) return [];
			const bodies = new Map<string, string>();
			for (const eventIds of chunks([...new Set(rows.map(row => row.event_id))], 500)) {
				const messages: Array<Pick<MessageRow, "event_id" | "body">> = await this.db("delivery_messages").whereIn("event_id", eventIds).select("event_id", "body");
				for (const message of messages) bodies.set(message.event_id, message.body);
			}
			return rows.map(row => ({
				id: row.id,
				webhookId: row.webhook_id,
				body: bodies.get(row.event_id)!,
				leaseId,
				leaseExpiresAt,
				attemptCount: Number(row.attempt_count),
				firstAttemptAt: row.first_attempt_at,
				manualRetry: isTrue(row.manual_retry),
			}));
		},

		claimSoon(this: DispatcherThis): void {
			if (this.stopping) return;
			setImmediate(() => void this.claimDue());
		},

		schedulePoll(this: DispatcherThis): void {
			if (this.stopping) return;
			this.pollTimer = setTimeout(async () => {
				this.polls += 1;
				await this.claimDue();
				if (this.polls % PARKED_RECHECK_POLLS === 0) {
					await this.recheckParked();
					// Entries are only dropped when read; without this, every webhook ever seen would stay.
					const now = Date.now();
					for (const [id, cached] of this.targets) if (cached.expiresAt < now) this.targets.delete(id);
				}
				this.schedulePoll();
			}, this.config.DELIVERY_POLL_INTERVAL);
		},

		/** Parked deliveries whose webhook is active again resume; those of deleted webhooks end. */
		async recheckParked(this: DispatcherThis): Promise<void> {
			try {
				const rows: Array<{ webhook_id: string }> = await this.db("deliveries").where({ parked: true, status: "pending" }).distinct("webhook_id").limit(1000);
				if (rows.length === 0) return;
				const ids = rows.map(row => row.webhook_id);
				const found = await this.broker.call<ResolvedWebhook[], { ids: string[] }>("webhooks.resolve", { ids });
				const byId = new Map(found.map(webhook => [webhook.id, webhook]));
				for (const id of ids) {
					const webhook = byId.get(id);
					if (!webhook) await this.cancelPending(id);
					else if (webhook.active) await this.resumeParked(id);
				}
			} catch (err) {
				this.logger.warn(`Re-checking parked deliveries failed, will try again: ${(err as Error).message}`);
			}
		},

		async resumeParked(this: DispatcherThis, webhookId: string): Promise<void> {
			const now = nowIso();
			const resumed = await this.db("deliveries").where({ webhook_id: webhookId, status: "pending", parked: true }).update({ parked: false, next_attempt_at: now, updated_at: now });
			if (resumed > 0) {
				this.logger.info(`Webhook ${webhookId} is active again: ${resumed} parked deliveries resumed`);
				this.backlog = true;
				this.claimSoon();
			}
		},

		/** Cancels every pending delivery of a webhook; a lease in flight loses its write. */
		async cancelPending(this: DispatcherThis, webhookId: string): Promise<number> {
			const now = nowIso();
			return this.db("deliveries")
				.where({ webhook_id: webhookId, status: "pending" })
				.update({ status: "cancelled", next_attempt_at: null, lease_id: null, parked: false, updated_at: now });
		},

		// ---- delivery log helpers ------------------------------------------------------------

		customerOf(this: DispatcherThis, ctx: Context<unknown, TenantMeta>): string {
			const customerId = ctx.meta.customerId;
			if (typeof customerId !== "string" || customerId === "") throw new NotFoundError("Webhook");
			return customerId;
		},

		/** The delivery, if it belongs to this webhook and the caller owns the webhook; else 404. */
		async ownedDelivery(this: DispatcherThis, ctx: Context<DeliveryParams, TenantMeta>): Promise<DeliveryRow> {
			const customerId = this.customerOf(ctx);
			const { id, delivery_id: deliveryId } = ctx.params;
			await ctx.call("webhooks.find", { id });
			const row: DeliveryRow | undefined = await this.db("deliveries as d")
				.join("delivery_messages as m", "m.event_id", "d.event_id")
				.where({ "d.id": deliveryId, "d.webhook_id": id, "d.customer_id": customerId })
				.first("d.*", "m.type");
			if (!row) throw new NotFoundError("Delivery");
			return row;
		},

		present(this: DispatcherThis, row: DeliveryRow): Delivery {
			const now = nowIso();
			const underWay = row.status === "pending" && row.lease_id !== null && row.next_attempt_at !== null && row.next_attempt_at > now;
			return {
				id: row.id,
				webhook_id: row.webhook_id,
				event_id: row.event_id,
				message_id: messageIdOf(row.id),
				type: row.type ?? TASKING_ORDER_STATUS_TOPIC,
				status: row.status,
				attempt_count: Number(row.attempt_count),
				// While leased the column holds the lease expiry, not a plan: the attempt is under way.
				next_attempt_at: row.status !== "pending" || underWay ? null : row.next_attempt_at,
				last_attempt_at: row.last_attempt_at,
				last_status_code: row.last_status_code === null ? null : Number(row.last_status_code),
				last_error_kind: row.last_error_kind,
				created_at: row.created_at,
				updated_at: row.updated_at,
			};
		},
	},

	created(this: DispatcherThis) {
		this.stopping = false;
		this.queues = new Map();
		this.inFlight = 0;
		this.inFlightByWebhook = new Map();
		this.held = 0;
		this.heldByWebhook = new Map();
		this.attemptsInFlight = new Set();
		this.targets = new Map();
		this.resolving = new Set();
		this.claimRun = null;
		this.backlog = true;
		this.pollTimer = null;
		this.polls = 0;
		this.intake = new MicroBatcher(items => this.persistEvents(items), MAX_INTAKE_BATCH);
		this.results = new MicroBatcher(updates => this.writeUpdates(updates), MAX_RESULT_BATCH, RESULT_LINGER_MS);
		this.metrics = {
			attempts: counter(this.broker, "webhook_delivery_attempts_total", "Webhook delivery attempts, by result", ["result"]),
			deliveries: counter(this.broker, "webhook_deliveries_finished_total", "Webhook deliveries that reached a final status", ["status"]),
			duration: histogram(this.broker, "webhook_delivery_attempt_seconds", "Duration of webhook delivery attempts", ["result"], [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15]),
		};
	},

	async started(this: DispatcherThis) {
		const { DELIVERY_LEASE, DELIVERY_TIMEOUT } = this.config;
		if (DELIVERY_LEASE < DELIVERY_TIMEOUT + 2 * LEASE_SAFETY_MS) {
			throw new Error(`Invalid configuration: DELIVERY_LEASE (${DELIVERY_LEASE} ms) must exceed DELIVERY_TIMEOUT (${DELIVERY_TIMEOUT} ms) by at least ${(2 * LEASE_SAFETY_MS) / 1000} s`);
		}
		this.sender = new WebhookSender({
			allowNets: this.config.WEBHOOK_ALLOW_NETS,
			caFile: this.config.WEBHOOK_CA_FILE,
			connectionsPerOrigin: this.config.DELIVERY_WEBHOOK_CONCURRENCY,
		});
		this.schedulePoll();
		this.claimSoon();
	},

	async stopped(this: DispatcherThis) {
		this.stopping = true;
		if (this.pollTimer) clearTimeout(this.pollTimer);
		// No new leases from here on. Deliveries still queued go back to the database as due now;
		// attempts in flight finish and are written; the writers drain before the database
		// connection is released (the DbMixin's stopped runs after this one).
		await this.claimRun;
		await this.intake.drain();
		for (const queue of this.queues.values()) {
			for (const delivery of queue) {
				this.finish(delivery, { status: "pending", attemptCount: delivery.attemptCount, nextAttemptAt: nowIso(), parked: false, manualRetry: delivery.manualRetry });
			}
		}
		this.queues.clear();
		await Promise.allSettled([...this.attemptsInFlight]);
		await this.results.drain();
		await this.sender?.close();
	},
};

export default DispatcherService;
