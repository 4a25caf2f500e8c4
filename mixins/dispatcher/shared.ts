// The dispatcher's shared vocabulary: its tuning constants, the rows it reads and writes, what a
// leased delivery carries through the worker, and `DispatcherThis`, the one type of `this` that
// services/dispatcher.service.ts and every mixin in this folder share.
import type { Context, ServiceBroker, ServiceSchema, ServiceSettingSchema } from "moleculer";
import type { Knex } from "knex";
import type { DbServiceThis } from "../db.mixin";
import type { MicroBatcher } from "../../lib/micro-batcher";
import type { SqliteConnection } from "../../lib/sqlite-statements";
import type { SubscriberCache } from "../../lib/subscriber-cache";
import type { EndpointBreakers } from "../../lib/endpoint-breaker";
import type { counter, histogram } from "../../lib/metrics";
import type { DeliveryOutcome } from "../../lib/webhook-sender";
import type { DeliverySender } from "../../lib/threaded-sender";
import type { ResolvedWebhook, Subscriber } from "../../lib/schemas/webhooks";
import type { Attempt, Delivery, DeliveryParams, DeliveryStatus, PublishResult } from "../../lib/schemas/deliveries";
import type { WebhookDisabledEvent } from "../../lib/schemas/webhooks";
import type { WebhookHealth } from "./lifecycle.mixin";
import type { WrittenEvents } from "./event-writes";
import type { OrderQueue } from "./order-queues.mixin";
import type { RateSlots } from "../../lib/rate-slots";
import type { YoungTableStatistics } from "../../lib/young-table-statistics";
import type { DrainRates } from "../../lib/drain-rates";
import type { TenantMeta } from "../../lib/gateway-meta";

// One lease budget, for intake and claims alike (queued + in flight): a webhook may hold
// DELIVERY_WEBHOOK_CONCURRENCY x WEBHOOK_LEASE_FACTOR leases, an instance DELIVERY_MAX_LEASES.
// Intake leases what it writes while there is room (the row was just
// written and its body is in hand), since leaving it to a claim costs a claim query, a body read
// and a second write: with intake at 4 x, most rows went the claim way under the benchmark's load
// and knex took 12-19 % of the event loop. When a claim had a smaller budget than intake, a row
// intake could not lease waited until the webhook was nearly empty while newer ones went ahead:
// the 0.6-1.1 s stragglers of the first seconds.
// The instance budget is the larger, so that it only bounds memory: with one budget of 16 x both
// ways, eight healthy webhooks' queues filled the instance and every row of every webhook went the
// claim way (healthy p99 14-33 x in the bad-neighbour benchmark). A queued delivery whose lease
// could run out before its attempt ends is given back unattempted.
// A webhook whose queue has been measured draining fast (lib/drain-rates.ts) may hold what it
// sends in half the lease's headroom (leaseAheadMs: 20.5 s with the default 60 s lease and 15 s
// timeout), up to MAX_WEBHOOK_LEASE_FACTOR x its concurrency. With the fixed share, nearly every
// delivery of a burst of 100,000 went the claim way: a second write (the lease) and a refill's read
// for each. Every queued delivery of such a webhook starts within leaseAheadMs at the pace it last
// drained at; if its receiver slows down meanwhile, the rule above gives back what would outlive
// its lease.
export const WEBHOOK_LEASE_FACTOR = 16;
export const MAX_WEBHOOK_LEASE_FACTOR = 2_048;
// Webhook URLs and secrets, and each customer's subscribed webhooks, are cached this long;
// webhooks.* events drop entries sooner. Short, because a broadcast can be missed (a node
// joining or reconnecting, clears aside), and because the previous secret stops signing when its
// rotation grace ends.
export const TARGET_CACHE_MS = 5_000;
// An attempt only starts if it can end (DELIVERY_TIMEOUT) this long before its lease expires,
// so no other instance can ever take the delivery over while it is in flight.
export const LEASE_SAFETY_MS = 2_000;
/**
 * How much of a fast webhook's sending it may hold leased ahead (webhookShare): half the time a
 * queued lease has before its attempt could outlive it, so its queue may drain at half the pace it
 * was measured at before anything is given back unattempted.
 */
export const leaseAheadMs = ({ DELIVERY_LEASE, DELIVERY_TIMEOUT }: { DELIVERY_LEASE: number; DELIVERY_TIMEOUT: number }): number =>
	(DELIVERY_LEASE - DELIVERY_TIMEOUT - 2 * LEASE_SAFETY_MS) / 2;
// Parked deliveries (webhook disabled) are re-checked every this many polls, in case the
// webhooks.updated event that re-enabled it was missed (e.g. while this node reconnected).
export const PARKED_RECHECK_POLLS = 30;
// An endpoint whose attempts failed this many times in a row gets one probe attempt a second
// until one succeeds (lib/endpoint-breaker.ts); its deliveries wait in the database meanwhile.
export const BREAKER = { openAfter: 5, probeEveryMs: 1_000, quietMs: 5_000 } as const;
export const MAX_CLAIM_BATCH = 500;
export const MAX_INTAKE_BATCH = 500;
export const MAX_RESULT_BATCH = 500;
// Results wait this long to be written together: nobody waits on them, and fewer, larger
// transactions cost the single SQLite writer much less (commits were a sixth of the dispatcher's
// CPU at 5 ms). The row stays leased meanwhile, so the wait is invisible except in the log.
export const RESULT_LINGER_MS = 20;
// SQLite intake while the event loop is over 70 % busy (a burst, a start with cold code): batches
// wait 4 ms for company. In the delivery benchmark the median first-3-s p99 went from 3.8x the bare
// relay to 1.4x (five runs each); on PostgreSQL it changed nothing, so it is not used there.
export const SQLITE_INTAKE_BUSY_LINGER = { utilisation: 0.7, lingerMs: 4 } as const;
// Rows per multi-row statement: stays far below SQLite's and PostgreSQL's bind-variable limits.
export const ROWS_PER_STATEMENT = 200;
export const REJECTED_EXCERPT_CHARS = 2_000;
export const DEPENDENCY_RETRY_MS = 1_000;
// The dispatcher's calls to the webhooks service (subscribers, resolve) give up after this, not
// the broker's 30 s: a request published while NATS was away is lost, and its caller (an intake
// batch, a claim, the worker) would sit idle for the rest of the 30 s after NATS came back. The
// caller retries as it does after any dependency failure; the answer normally takes milliseconds.
const WEBHOOKS_CALL_TIMEOUT_MS = 10_000;

/** The customer's webhooks subscribed to the topic (webhooks.subscribers). */
export const lookUpSubscribers = (broker: ServiceBroker, customerId: string, topic: string) =>
	broker.call<Subscriber[], { customerId: string; topic: string }>("webhooks.subscribers", { customerId, topic }, { timeout: WEBHOOKS_CALL_TIMEOUT_MS });

/** The webhooks of these ids that still exist, with their URLs and secrets (webhooks.resolve). */
export const resolveWebhooks = (broker: ServiceBroker, ids: string[]) => broker.call<ResolvedWebhook[], { ids: string[] }>("webhooks.resolve", { ids }, { timeout: WEBHOOKS_CALL_TIMEOUT_MS });

export interface MessageRow {
	event_id: string;
	customer_id: string;
	user_id: string;
	type: string;
	body: string;
	occurred_at: string;
	created_at: string;
	/** The W3C traceparent of the event's trace (lib/tracing.ts), null with tracing off. */
	trace_context?: string | null;
}

export interface DeliveryRow {
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
	/** The order's queue (lib/order-queues.ts); null when not ordered. */
	order_key: string | null;
	/** Pending behind the head of its order's queue: not due until the head ends. */
	waiting: boolean | number;
	created_at: string;
	updated_at: string;
	/** From delivery_messages, joined in for the log. */
	type?: string;
	/** From webhooks.find, for the log: a disabled webhook's deliveries have no next attempt. */
	webhook_active?: boolean;
}

/** What intake writes; the other columns start at their defaults (0, false, null). */
export type NewDeliveryRow = Pick<DeliveryRow, "id" | "event_id" | "webhook_id" | "customer_id" | "status" | "next_attempt_at" | "lease_id" | "order_key" | "created_at" | "updated_at">;

export interface AttemptRow {
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
export interface LeasedDelivery {
	id: string;
	webhookId: string;
	body: string;
	leaseId: string;
	leaseExpiresAt: number;
	/** Attempts made before this one. */
	attemptCount: number;
	firstAttemptAt: string | null;
	manualRetry: boolean;
	/** Its order's queue: when it ends, the next delivery of the queue is set going. */
	orderKey: string | null;
	/** The event's stored traceparent: each attempt's span joins the event's trace. */
	traceContext?: string | null;
}

/** What a claim statement returns of each row it leases (CLAIMED_COLUMNS). */
export type ClaimedRow = Pick<DeliveryRow, "id" | "event_id" | "webhook_id" | "attempt_count" | "first_attempt_at" | "manual_retry" | "order_key">;
export const CLAIMED_COLUMNS = "id, event_id, webhook_id, attempt_count, first_attempt_at, manual_retry, order_key";

/** What one claim leased, and the webhooks it left at their share of leases (more of their rows may be due). */
export interface ClaimedBatch {
	leased: LeasedDelivery[];
	filledWebhooks: string[];
}

/** What a leased delivery becomes: written back with the lease as the guard. */
export interface DeliveryUpdate {
	delivery: LeasedDelivery;
	status: DeliveryStatus;
	attemptCount: number;
	nextAttemptAt: string | null;
	parked: boolean;
	manualRetry: boolean;
	outcome?: DeliveryOutcome;
}

/** A webhook as the worker needs it; `null` in the cache means it no longer exists. */
export type Target = Pick<ResolvedWebhook, "id" | "url" | "active" | "secrets" | "previousSecretExpiresAt" | "headers"> & { rateLimit: number | null };

export const targetOf = (webhook: Subscriber, active: boolean): Target => ({
	id: webhook.id,
	url: webhook.url,
	active,
	secrets: webhook.secrets,
	previousSecretExpiresAt: webhook.previousSecretExpiresAt,
	headers: webhook.headers,
	rateLimit: webhook.rateLimit ?? null,
});

/** How long signing data may be kept: `maxAgeMs`, and never past the previous secret's grace. */
export function keepSigningUntil(webhooks: Array<Pick<Subscriber, "previousSecretExpiresAt">>, maxAgeMs: number, now = Date.now()): number {
	let until = now + maxAgeMs;
	for (const { previousSecretExpiresAt } of webhooks) if (previousSecretExpiresAt) until = Math.min(until, Date.parse(previousSecretExpiresAt));
	return until;
}

export interface IntakeItem {
	eventId: string;
	customerId: string;
	userId: string;
	type: string;
	body: string;
	occurredAt: string;
	/** The tasking order: deliveries to webhooks ordered per order queue by it. */
	orderId: string | null;
	traceContext: string | null;
}

export type EventSource = "event" | "publish" | "channel";

export type { TenantMeta };

export type DispatcherThis = DbServiceThis & {
	sender: DeliverySender;
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
	/** Endpoints failing here: one attempt at a time, and past BREAKER.openAfter only a probe a second. */
	breakers: EndpointBreakers;
	targets: Map<string, { target: Target | null; expiresAt: number }>;
	/** Each customer's webhooks subscribed to tasking:order_status, for intake (intake.mixin.ts). */
	subscribers: SubscriberCache<Subscriber>;
	resolving: Set<string>;
	claimRun: Promise<void> | null;
	/** A claimSoon is queued for the next turn of the event loop; more calls before it runs add nothing. */
	claimQueued: boolean;
	/** Due rows may be waiting that the last claim did not take (capacity ran out). */
	backlog: boolean;
	/**
	 * A sequence, moved on by every requestClaim and every intake batch that left rows for a
	 * claim: a claim that ends finding nothing more tells by it whether rows came in while it ran.
	 */
	claimSeq: number;
	/** claimSeq at the last requestClaim. */
	requestedAt: number;
	/** Per webhook, claimSeq when intake last left one of its rows for a claim. */
	unleasedAt: Map<string, number>;
	/**
	 * Webhooks with due rows left in the database for a claim (intake found no lease, or a claim
	 * stopped at the webhook's share). Intake leases none of their new rows until a claim has
	 * taken the old ones, so no delivery is overtaken by newer ones of its webhook; they are
	 * claimed for once half of their share is free, not on every change elsewhere.
	 */
	waitingWebhooks: Set<string>;
	/**
	 * The claim of all due rows reads only rows due after this (epoch ms), since what a
	 * drained claim left due before it was excluded webhooks' piles; null reads all due rows.
	 */
	scanFrom: number | null;
	/** Waiting webhooks with half their share free, to be claimed for by their own rows (claimRefills). */
	refills: Set<string>;
	/** Waiting webhooks whose refill the instance had no room for: refilled once it has (roomFreed). */
	shortRefills: Set<string>;
	/** How fast each webhook's queue drained here while busy, which sizes its share of leases. */
	drainRates: DrainRates;
	pollTimer: NodeJS.Timeout | null;
	polls: number;
	/** A promotion failed (PostgreSQL): the next poll sweeps for queues without a head, not the next PARKED_RECHECK_POLLS-th. */
	headlessSweepDue: boolean;
	metrics: {
		attempts: ReturnType<typeof counter>;
		deliveries: ReturnType<typeof counter>;
		missedStarts: ReturnType<typeof counter>;
		duration: ReturnType<typeof histogram>;
		firstAttemptLag: ReturnType<typeof histogram>;
		claims: ReturnType<typeof histogram>;
	};

	// intake.mixin.ts
	ingestOrderStatus(payload: unknown, source: EventSource, ctx?: Context): Promise<void>;
	handToNotifier(event: unknown, ctx: Context): Promise<void>;
	acceptEvent(payload: unknown, source: EventSource, ctx?: Context): Promise<PublishResult>;
	persistEvents(items: IntakeItem[]): Promise<PublishResult[]>;
	writeEvents(messages: MessageRow[], deliveries: NewDeliveryRow[]): Promise<WrittenEvents>;
	insertMessages(trx: Knex.Transaction, rows: MessageRow[]): Promise<Set<string>>;
	insertDeliveries(trx: Knex.Transaction, rows: NewDeliveryRow[]): Promise<void>;
	// rejected-events.mixin.ts
	recordRejection(source: EventSource, payload: unknown, reason: string): Promise<void>;
	// worker.mixin.ts
	takeLease(webhookId: string): boolean;
	webhookShare(webhookId?: string): number;
	roomLeft(): number;
	wantsRefill(webhookId: string): boolean;
	releaseHold(webhookId: string): void;
	enqueue(delivery: LeasedDelivery): void;
	giveBack(delivery: LeasedDelivery): void;
	requeueFirst(delivery: LeasedDelivery): void;
	pump(): void;
	freshTarget(webhookId: string): Target | null | undefined;
	cacheTarget(webhookId: string, target: Target | null): void;
	cacheSubscriberTargets(subscribers: Subscriber[]): void;
	resolveTargets(webhookIds: string[]): Promise<void>;
	startAttempt(delivery: LeasedDelivery, target: Target, startBy: number | null): void;
	noteEndpointOutcome(webhookId: string, success: boolean): void;
	returnQueued(webhookId: string): number;
	// results.mixin.ts
	afterAttempt(delivery: LeasedDelivery, outcome: DeliveryOutcome): DeliveryUpdate;
	observeFirstAttemptLag(delivery: LeasedDelivery, outcome: DeliveryOutcome): void;
	finish(delivery: LeasedDelivery, change: Omit<DeliveryUpdate, "delivery">): void;
	writeUpdates(updates: DeliveryUpdate[]): Promise<boolean[]>;
	takeWaitingResults(): RidingResults | null;
	// claims.mixin.ts
	claimDue(): Promise<void>;
	claimUntilFull(): Promise<void>;
	claimBatch(limit: number, dueSince?: number | null): Promise<ClaimedBatch>;
	claimDueRows(limit: number, dueSince: number | null): Promise<ClaimedBatch>;
	claimPass(): Promise<void>;
	claimRefills(): Promise<void>;
	claimRowsOf(webhookId: string, limit: number, newest?: boolean): Promise<ClaimedBatch>;
	claimRowsOfWebhook(webhookId: string, limit: number, newest?: boolean): Promise<ClaimedBatch>;
	withBodies(rows: ClaimedRow[], leaseId: string, leaseExpiresAt: number): Promise<LeasedDelivery[]>;
	takeClaimed(batch: ClaimedBatch): ClaimedBatch;
	claimSoon(): void;
	requestClaim(): void;
	markBacklog(): void;
	requestRefill(webhookId: string): void;
	roomFreed(): void;
	leftRowsSince(webhookId: string, seq: number): boolean;
	stopWaiting(webhookId: string): void;
	schedulePoll(): void;
	// parking.mixin.ts
	parkPending(webhookId: string): Promise<number>;
	recheckParked(): Promise<void>;
	resumeParked(webhookId: string): Promise<void>;
	cancelPending(webhookId: string): Promise<number>;
	// lifecycle.mixin.ts
	health: Map<string, WebhookHealth>;
	healthTimer: NodeJS.Timeout | null;
	/** The flush the timer started last (flushHealth never rejects). */
	healthFlush: Promise<void>;
	noteOutcome(webhookId: string, outcome: DeliveryOutcome, attemptCount: number): void;
	flushHealth(): Promise<void>;
	disableWebhook(webhookId: string, reason: "gone" | "failing"): Promise<void>;
	notifyDisabled(notice: WebhookDisabledEvent): Promise<void>;
	// delivery-log.mixin.ts
	customerOf(ctx: Context<unknown, TenantMeta>): string;
	ownedDelivery(ctx: Context<DeliveryParams, TenantMeta>): Promise<DeliveryRow>;
	present(row: DeliveryRow, waitingFor?: string): Delivery;
	// rate-limits.mixin.ts
	/** The send times this instance holds for rate-limited webhooks. */
	rateSlots: RateSlots;
	/** PostgreSQL: ANALYZE of the tables while they are young (lib/young-table-statistics.ts); null on SQLite. */
	tableStatistics: YoungTableStatistics | null;
	analyzeYoungTables(rowsWritten: number): Promise<void>;
	/** The send loop's wake-up at a limited webhook's next send time. */
	rateWake: { at: number; timer: NodeJS.Timeout } | null;
	takeSendTime(webhookId: string, limit: number, now: number): number | null;
	reserveSlots(webhookId: string, limit: number, waiting: number): Promise<void>;
	wakeAt(at: number): void;
	// order-queues.mixin.ts
	releaseOrderQueues(webhookId: string): Promise<number>;
	promoteHeadless(queues: OrderQueue[]): Promise<void>;
	sweepHeadlessQueues(): Promise<void>;
	waitingForOf(rows: DeliveryRow[]): Promise<Map<string, string>>;
};

/** SQLite: results taken from their batcher to be written in another writer's transaction. */
export interface RidingResults {
	/** Inside the transaction. */
	write(connection: SqliteConnection): void;
	/** After the commit: each result is answered whether its lease still held. */
	committed(): void;
	/** The transaction failed: the results are failed too, and their writers try again. */
	failed(error: unknown): void;
}

/** A part of the dispatcher: its actions, events and methods, all run with `this` a dispatcher. */
export type DispatcherMixin = Partial<ServiceSchema<ServiceSettingSchema, DispatcherThis>>;

/** A hand retry or a recovered delivery leaves its order's queue: it goes at once, and waits for nothing. */
export const OUT_OF_ORDER_QUEUE = { order_key: null, waiting: false } as const;

export const isTrue = (value: boolean | number | null | undefined) => Boolean(value);
