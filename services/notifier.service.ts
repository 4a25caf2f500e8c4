// notifier: owns the email outbox (tables `email_outbox`, `email_rejected_events`), the
// order-status email and its SMTP sender, and the RFC 8058 one-click unsubscribe.
//
// It consumes `tasking.order_status` on its own (its own consumer group on the durable channel in
// cluster mode; see mixins/order-status-intake.mixin.ts), apart from the dispatcher: a slow or
// absent dispatcher never holds up an email, nor the other way round.
//
// How an email travels (each step is a mixin in mixins/notifier/):
//   outbox  intake: a valid event with a terminal status (fulfilled, failed, expired) becomes an
//           outbox row for the order's owner, unique per (event, user). A repeat is a no-op. An
//           owner known not to want it (a per-user cache of `users.emailPreference`, dropped on
//           `users.emailPreferenceChanged`) gets no row.
//   worker  due rows are claimed with a lease (FOR UPDATE SKIP LOCKED on PostgreSQL), the
//           owner's preference is asked from `users`, and the email is sent, then marked sent.
//           Transient failures are retried on MAIL_RETRY_SCHEDULE; permanent ones are marked
//           failed. Leases are renewed while a send runs, so only a dead process loses its
//           claims; another process (or the restarted one) takes them over when the lease runs out.
//   unsubscribe the link in every email leads to a confirmation page and the one-click POST.
// A crash between the server's "250 OK" and the "sent" mark resends the same email with the same
// Message-ID: that window (one small UPDATE) is the only source of duplicates.
//
// Settings come from the shared configuration (this.config, lib/config.ts, set by DbMixin):
// SMTP_URL, SMTP_CA_FILE, MAIL_FROM, MAIL_SEND_TIMEOUT, MAIL_CONCURRENCY, MAIL_POLL_INTERVAL,
// MAIL_LEASE, MAIL_RETRY_SCHEDULE, MAIL_PREFERENCES_URL, SECRETS_KEY (unsubscribe signing key),
// UNSUBSCRIBE_TOKEN_TTL, PUBLIC_BASE_URL (where links point) and RETENTION_PERIOD.
//
// This file wires the parts and owns the state they share (initialised in `created`) and the
// order of start and shutdown. Constants, row types and `NotifierThis` are in
// mixins/notifier/shared.ts.
import crypto from "node:crypto";
import path from "node:path";
import type { ServiceSchema, ServiceSettingSchema } from "moleculer";
import { DbMixin } from "../mixins/db.mixin";
import { OrderStatusIntakeMixin } from "../mixins/order-status-intake.mixin";
import { NotifierBacklogMixin } from "../mixins/backlog.mixin";
import { RetentionMixin } from "../mixins/retention.mixin";
import { notifierMigrations } from "../migrations/notifier";
import { ConfigError } from "../lib/config";
import { counter } from "../lib/metrics";
import { createMailTransport } from "../lib/mail-transport";
import { deriveUnsubscribeKey } from "../lib/unsubscribe-token";
import { EmailPreferenceCache } from "../lib/email-preference-cache";
import { EMAIL_PREFERENCE_CACHE_USERS, EMAIL_PREFERENCE_TTL_MS, type NotifierThis } from "../mixins/notifier/shared";
import { OutboxMixin } from "../mixins/notifier/outbox.mixin";
import { WorkerMixin } from "../mixins/notifier/worker.mixin";
import { UnsubscribeMixin } from "../mixins/notifier/unsubscribe.mixin";
import { NOTIFIER_PRUNE_JOBS } from "../mixins/notifier/retention";

// What tests and tools import from here; they live with the parts that use them.
export { OUTBOX_STATUSES, eventKeyOf, nextAttemptAt, type OutboxEntry, type OutboxStatus } from "../mixins/notifier/shared";

// Moleculer types a mixin with the base Service as `this`; the parts are typed with NotifierThis.
const parts = [
	// channel and event tasking.order_status (the notifier consumer group), calling ingestOrderStatus
	OrderStatusIntakeMixin("notifier"),
	// action backlog (the outbox gauges of /metrics)
	NotifierBacklogMixin,
	// action prune; RETENTION_PERIOD: sent, failed and skipped emails and rejected events; pending ones stay
	RetentionMixin(NOTIFIER_PRUNE_JOBS),
	// action outbox (operators' REPL); events users.emailPreferenceChanged, topics.changed, $transporter/$node (the preference cache);
	// ingestOrderStatus, unwantedEmailReason, recordEmail, recordRejected, toEntry
	OutboxMixin,
	// wakeWorker, pollOutbox, claimDue, processEmail, composeEmail, publicBaseUrl, settle, retryOrFail, renewLeases
	WorkerMixin,
	// actions unsubscribePage, unsubscribe (GET / POST /email/unsubscribe); topicName
	UnsubscribeMixin,
] as Partial<ServiceSchema>[];

const NotifierService: ServiceSchema<ServiceSettingSchema, NotifierThis> = {
	name: "notifier",
	// DbMixin last: its hooks run first on created and started, and last on stopped.
	mixins: [...parts, DbMixin("notifier", notifierMigrations) as Partial<ServiceSchema>],

	created(this: NotifierThis) {
		// this.config is set by DbMixin's created hook, which runs before this one.
		const config = this.config;
		// loadConfig() has already refused these for the server; a broker built from parseConfig()
		// alone (tests, benchmarks) meets them here.
		if (!config.SECRETS_KEY) throw new ConfigError("Invalid configuration: SECRETS_KEY: required to sign unsubscribe links");
		if (config.production && !config.PUBLIC_BASE_URL) {
			throw new ConfigError("Invalid configuration: PUBLIC_BASE_URL: required with NODE_ENV=production, the address the unsubscribe links in emails point to");
		}
		this.unsubscribeKey = deriveUnsubscribeKey(config.SECRETS_KEY);
		this.transport = createMailTransport({
			smtpUrl: config.SMTP_URL,
			caFile: config.SMTP_CA_FILE,
			mailDir: path.resolve(config.DATA_DIR, "mail"),
			timeoutMs: config.MAIL_SEND_TIMEOUT,
		});
		this.metrics = {
			attempts: counter(this.broker, "email_send_attempts_total", "Email send attempts, by result (sent, retry, failed)", ["result"]),
			finished: counter(this.broker, "emails_finished_total", "Outbox emails that reached a final status (sent, failed, skipped)", ["status"]),
			notQueued: counter(this.broker, "emails_not_queued_total", "Email-worthy events that wrote no outbox row: the user does not want the email, by reason (email_off, no_address)", ["reason"]),
		};
		this.emailPreferences = new EmailPreferenceCache({ ttlMs: EMAIL_PREFERENCE_TTL_MS, maxEntries: EMAIL_PREFERENCE_CACHE_USERS });
		this.inFlight = new Map();
		this.pollTimer = null;
		this.heartbeatTimer = null;
		this.polling = false;
		this.pollRequested = false;
		this.stopping = false;
	},

	async started(this: NotifierThis) {
		// Runs after DbMixin's started hook: the tables exist.
		this.workerId = `${this.broker.nodeID}:${crypto.randomUUID()}`.slice(0, 100);
		this.heartbeatTimer = setInterval(() => void this.renewLeases(), Math.max(100, Math.floor(this.config.MAIL_LEASE / 3)));
		this.logger.info(`Sending email through ${this.transport.description}`);
		this.wakeWorker();
	},

	async stopped(this: NotifierThis) {
		this.stopping = true;
		if (this.pollTimer) clearTimeout(this.pollTimer);
		// Let running sends finish (each is bounded by MAIL_SEND_TIMEOUT) so that they are recorded;
		// the database is released only after this hook (DbMixin's stopped runs later).
		await Promise.allSettled([...this.inFlight.values()]);
		if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
		this.transport.close();
	},
};

export default NotifierService;
