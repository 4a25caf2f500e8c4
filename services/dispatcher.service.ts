// dispatcher: owns webhook delivery (tables `delivery_messages`, `deliveries` with each delivery's
// first attempt, `delivery_attempts` with the attempts after it, the view `delivery_attempt_log` of
// all of them, and `delivery_rejected_events`). It takes in `tasking.order_status` events,
// persists one message per event and one delivery per subscribed webhook before any request is
// made (acknowledging a channel event only then), sends them through lib/webhook-sender.ts, retries failures on the persisted schedule of
// lib/retry-schedule.ts, and serves the webhook test, the delivery log and
// (mixins/dispatcher/stats.mixin.ts) the per-hour delivery stats.
//
// How a delivery moves (each step is a mixin in mixins/dispatcher/):
//   intake   events arriving together are written in one transaction; each new delivery is
//            leased to this instance in that same insert and handed straight to the worker.
//   worker   sends within the global and per-webhook concurrency limits; results are written
//            back in batches (deliveries updated and later attempts inserted in one transaction).
//   claims   a poll loop leases due deliveries (retries, overflow, other instances' expired
//            leases). A lease is the row's next_attempt_at moved to the lease expiry plus a
//            lease_id: an abandoned lease simply makes the row due again, and a result write
//            must match the lease_id, so a stale worker cannot overwrite a newer attempt.
//            PostgreSQL claims with FOR UPDATE SKIP LOCKED; SQLite has a single writer.
//   lifecycle a 410 Gone or a long run of failures disables the webhook (its deliveries park),
//            the customer is told through `webhook:disabled`, and failed deliveries are recovered.
//
// This file wires the parts and owns the state they share (initialised in `created`) and the
// order of start and shutdown. Constants, row types and `DispatcherThis` are in
// mixins/dispatcher/shared.ts.
import type { ServiceSchema, ServiceSettingSchema } from "moleculer";
import { DbMixin, isPostgres } from "../mixins/db.mixin";
import { OrderStatusIntakeMixin } from "../mixins/order-status-intake.mixin";
import { dispatcherMigrations } from "../migrations/dispatcher";
import { MicroBatcher } from "../lib/micro-batcher";
import { SubscriberCache } from "../lib/subscriber-cache";
import { EndpointBreakers } from "../lib/endpoint-breaker";
import { counter, histogram } from "../lib/metrics";
import { ThreadedWebhookSender, publishSenderMetrics } from "../lib/threaded-sender";
import { BREAKER, LEASE_SAFETY_MS, MAX_INTAKE_BATCH, MAX_RESULT_BATCH, RESULT_LINGER_MS, SQLITE_INTAKE_BUSY_LINGER, TARGET_CACHE_MS, keepSigningUntil, type DispatcherThis } from "../mixins/dispatcher/shared";
import { IntakeMixin } from "../mixins/dispatcher/intake.mixin";
import { RejectedEventsMixin } from "../mixins/dispatcher/rejected-events.mixin";
import { WorkerMixin } from "../mixins/dispatcher/worker.mixin";
import { ResultsMixin } from "../mixins/dispatcher/results.mixin";
import { ClaimsMixin } from "../mixins/dispatcher/claims.mixin";
import { ParkingMixin } from "../mixins/dispatcher/parking.mixin";
import { DeliveryLogMixin } from "../mixins/dispatcher/delivery-log.mixin";
import { DeliveryStatsMixin } from "../mixins/dispatcher/stats.mixin";
import { DispatcherBacklogMixin } from "../mixins/backlog.mixin";
import { DispatcherOperatorMixin } from "../mixins/dispatcher-operator.mixin";
import { LifecycleMixin } from "../mixins/dispatcher/lifecycle.mixin";
import { OrderQueuesMixin } from "../mixins/dispatcher/order-queues.mixin";
import { RateLimitsMixin } from "../mixins/dispatcher/rate-limits.mixin";
import { RateSlots } from "../lib/rate-slots";
import { DrainRates } from "../lib/drain-rates";
import { YoungTableStatistics } from "../lib/young-table-statistics";
import { DISPATCHER_PRUNE_JOBS } from "../mixins/dispatcher/retention";
import { RetentionMixin } from "../mixins/retention.mixin";

// Moleculer types a mixin with the base Service as `this`; the parts are typed with DispatcherThis.
const parts = [
	// channel and event tasking.order_status (the dispatcher consumer group), calling ingestOrderStatus
	OrderStatusIntakeMixin("dispatcher"),
	// action publish; events webhooks.* (the subscriber cache); ingestOrderStatus, acceptEvent, persistEvents
	IntakeMixin,
	// recordRejection (table delivery_rejected_events)
	RejectedEventsMixin,
	// events webhooks.updated / removed / rotated; takeLease, enqueue, pump, startAttempt
	WorkerMixin,
	// afterAttempt, finish, writeUpdates (the lease-guarded batch write)
	ResultsMixin,
	// claimDue, claimBatch, claimRefills (a waiting webhook's own rows), schedulePoll
	ClaimsMixin,
	// parking: parkPending, recheckParked, resumeParked, cancelPending
	ParkingMixin,
	// actions testWebhook, listDeliveries, getDelivery, retryDelivery
	DeliveryLogMixin,
	// action webhookStats (GET /webhooks/{id}/stats)
	DeliveryStatsMixin,
	// action backlog (the pending-delivery gauges of /metrics)
	DispatcherBacklogMixin,
	// actions locateDelivery, failedDeliveriesSince (the operators' REPL commands)
	DispatcherOperatorMixin,
	// action recover; events webhooks.updated / disabled; noteOutcome, disableWebhook
	LifecycleMixin,
	// ordering per order: promotion of a queue's next delivery, event webhooks.updated (ordering "none"), waitingForOf
	OrderQueuesMixin,
	// rate limits: takeSendTime (the send loop's gate), reserveSlots (the shared schedule), wakeAt
	RateLimitsMixin,
	// action prune; RETENTION_PERIOD: old messages, finished deliveries, attempts, rejected events
	RetentionMixin(DISPATCHER_PRUNE_JOBS),
] as Partial<ServiceSchema>[];

const DispatcherService: ServiceSchema<ServiceSettingSchema, DispatcherThis> = {
	name: "dispatcher",
	// DbMixin last: its hooks run first on created and started, and last on stopped.
	mixins: [...parts, DbMixin("dispatcher", dispatcherMigrations) as Partial<ServiceSchema>],

	created(this: DispatcherThis) {
		this.stopping = false;
		this.queues = new Map();
		this.inFlight = 0;
		this.inFlightByWebhook = new Map();
		this.held = 0;
		this.heldByWebhook = new Map();
		this.attemptsInFlight = new Set();
		this.breakers = new EndpointBreakers(BREAKER);
		this.drainRates = new DrainRates();
		this.targets = new Map();
		this.resolving = new Set();
		this.subscribers = new SubscriberCache((subscribers, loadedAt) => keepSigningUntil(subscribers, TARGET_CACHE_MS, loadedAt), {
			// A list refreshed ahead of its deadline refreshes the worker's targets too, so that they
			// do not run out either while events keep coming (the pump would wait for webhooks.resolve).
			onRefreshed: (_customerId, subscribers) => this.cacheSubscriberTargets(subscribers),
		});
		this.claimRun = null;
		this.claimQueued = false;
		this.backlog = true;
		this.waitingWebhooks = new Set();
		this.refills = new Set();
		this.shortRefills = new Set();
		this.scanFrom = null;
		this.claimSeq = 0;
		this.requestedAt = 0;
		this.unleasedAt = new Map();
		this.pollTimer = null;
		this.polls = 0;
		this.headlessSweepDue = false;
		this.rateSlots = new RateSlots();
		this.tableStatistics = isPostgres(this.db) ? new YoungTableStatistics(rows => this.analyzeYoungTables(rows)) : null;
		this.rateWake = null;
		// On SQLite each batch is a transaction on this event loop: a saturated loop lingers a little.
		this.intake = new MicroBatcher(items => this.persistEvents(items), MAX_INTAKE_BATCH, 0, isPostgres(this.db) ? undefined : SQLITE_INTAKE_BUSY_LINGER);
		this.results = new MicroBatcher(updates => this.writeUpdates(updates), MAX_RESULT_BATCH, RESULT_LINGER_MS);
		this.metrics = {
			attempts: counter(this.broker, "webhook_delivery_attempts_total", "Webhook delivery attempts, by result", ["result"]),
			deliveries: counter(this.broker, "webhook_deliveries_finished_total", "Webhook deliveries that reached a final status", ["status"]),
			missedStarts: counter(this.broker, "webhook_rate_limit_missed_starts_total", "Rate-limited attempts not made because they could not start by their send time's deadline (the delivery takes the next send time)"),
			duration: histogram(this.broker, "webhook_delivery_attempt_seconds", "Duration of webhook delivery attempts", ["result"], [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15]),
			firstAttemptLag: histogram(
				this.broker,
				"webhook_delivery_first_attempt_lag_seconds",
				"Time from a delivery's creation (its event persisted) to the start of its first attempt",
				[],
				[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
			),
			claims: histogram(
				this.broker,
				"webhook_delivery_claim_seconds",
				"Duration of claim statements (with their bodies' read), by kind: due (all webhooks' due rows) or webhook (one webhook's refill or probe)",
				["kind"],
				[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
			),
		};
	},

	async started(this: DispatcherThis) {
		const { DELIVERY_LEASE, DELIVERY_TIMEOUT } = this.config;
		if (DELIVERY_LEASE < DELIVERY_TIMEOUT + 2 * LEASE_SAFETY_MS) {
			throw new Error(`Invalid configuration: DELIVERY_LEASE (${DELIVERY_LEASE} ms) must exceed DELIVERY_TIMEOUT (${DELIVERY_TIMEOUT} ms) by at least ${(2 * LEASE_SAFETY_MS) / 1000} s`);
		}
		const senderOptions = {
			allowNets: this.config.WEBHOOK_ALLOW_NETS,
			caFile: this.config.WEBHOOK_CA_FILE,
			connectionsPerOrigin: this.config.DELIVERY_ORIGIN_CONNECTIONS,
		};
		if (this.config.DELIVERY_SENDER_THREADS === 0) {
			// Loaded here only: with sender threads (the default) this thread never sends, and undici
			// costs about 170 ms of CPU to load at every start.
			const { WebhookSender } = require("../lib/webhook-sender") as typeof import("../lib/webhook-sender");
			const inProcess = new WebhookSender(senderOptions);
			publishSenderMetrics(this.broker, inProcess);
			this.sender = inProcess;
		} else {
			const threaded = new ThreadedWebhookSender({ ...senderOptions, threads: this.config.DELIVERY_SENDER_THREADS });
			await threaded.start();
			publishSenderMetrics(this.broker, threaded);
			this.sender = threaded;
		}
		this.schedulePoll();
		this.claimSoon();
	},

	async stopped(this: DispatcherThis) {
		this.stopping = true;
		if (this.pollTimer) clearTimeout(this.pollTimer);
		if (this.rateWake) clearTimeout(this.rateWake.timer);
		// No new leases from here on. Deliveries still queued go back to the database as due now;
		// attempts in flight finish and are written; the writers drain before the database
		// connection is released (the DbMixin's stopped runs after this one).
		await this.claimRun;
		await this.intake.drain();
		for (const webhookId of [...this.queues.keys()]) this.returnQueued(webhookId);
		await Promise.allSettled([...this.attemptsInFlight]);
		await this.results.drain();
		await this.tableStatistics?.settled();
		await this.sender?.close();
	},
};

export default DispatcherService;
