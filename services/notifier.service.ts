// notifier: owns the email outbox (tables `email_outbox`, `email_rejected_events`), the
// order-status email and its SMTP sender, and the RFC 8058 one-click unsubscribe.
//
// It consumes `tasking.order_status` on its own (its own consumer group on the durable channel in
// cluster mode; see mixins/order-status-intake.mixin.ts), apart from the dispatcher: a slow or
// absent dispatcher never holds up an email, nor the other way round.
//
// How an email travels:
//   1. intake: a valid event with a terminal status (fulfilled, failed, expired) becomes an
//      outbox row for the order's owner, unique per (event, user). A repeat is a no-op.
//   2. worker: due rows are claimed with a lease (FOR UPDATE SKIP LOCKED on PostgreSQL), the
//      owner's preference is asked from `users`, and the email is sent, then marked sent.
//      Transient failures are retried on MAIL_RETRY_SCHEDULE; permanent ones are marked failed.
//   3. leases are renewed while a send runs, so only a dead process loses its claims; another
//      process (or the restarted one) takes them over when the lease runs out.
// A crash between the server's "250 OK" and the "sent" mark resends the same email with the same
// Message-ID: that window (one small UPDATE) is the only source of duplicates.
import crypto from "node:crypto";
import path from "node:path";
import type { Context, ServiceSchema, ServiceSettingSchema } from "moleculer";
import type { Counter } from "prom-client";
import { z } from "zod";
import { OrderStatusIntakeMixin } from "../mixins/order-status-intake.mixin";
import { RetentionMixin } from "../mixins/retention.mixin";
import { oldestRowsJob } from "../lib/retention";
import { DbMixin, isPostgres, nowIso, type DbServiceThis } from "../mixins/db.mixin";
import { NotifierBacklogMixin } from "../mixins/backlog.mixin";
import { issuesToProblems, zodParams } from "../mixins/validation";
import { notifierMigrations } from "../migrations/notifier";
import { ConfigError } from "../lib/config";
import { invalidField, isDependencyFailure, type FieldProblem } from "../lib/errors";
import { counter } from "../lib/metrics";
import { EMAIL_STATUSES, TASKING_ORDER_STATUS_TOPIC, TaskingOrderStatusEvent } from "../lib/schemas/events";
import { TASKING_ORDER_STATUS } from "../lib/schemas/topics";
import { buildOrderStatusEmail, messageIdFor, senderDomain, type ComposedEmail, type OrderSnapshot } from "../lib/email-message";
import { classifySendError, createMailTransport, type MailTransport } from "../lib/mail-transport";
import { deriveUnsubscribeKey, InvalidUnsubscribeTokenError, MAX_UNSUBSCRIBE_TOKEN_LENGTH, signUnsubscribeToken, verifyUnsubscribeToken } from "../lib/unsubscribe-token";
import { confirmUnsubscribePage, invalidLinkPage, unsubscribedPage, UNSUBSCRIBE_PAGE_HEADERS } from "../lib/unsubscribe-page";
import type { GatewayMeta } from "./api.service";

export const OUTBOX_STATUSES = ["pending", "sent", "failed", "skipped"] as const;
export type OutboxStatus = (typeof OUTBOX_STATUSES)[number];

const USERS_CALL_TIMEOUT_MS = 10_000;
const USERS_UNAVAILABLE_WAIT_MS = 2_000;
const MAX_REJECTED_PAYLOAD_CHARS = 16 * 1024;
const MAX_ERROR_CHARS = 1000;

interface OutboxRow {
	id: string;
	event_key: string;
	event_id: string | null;
	user_id: string;
	customer_id: string | null;
	order_id: string;
	order_status: string;
	order_snapshot: string;
	message_id: string;
	status: OutboxStatus;
	recipient: string | null;
	attempts: number;
	first_attempt_at: string | null;
	next_attempt_at: string;
	lease_owner: string | null;
	lease_until: string | null;
	last_error: string | null;
	smtp_response: string | null;
	created_at: string;
	updated_at: string;
	sent_at: string | null;
}

/** What operators see of an outbox row (REPL: `call notifier.outbox --status failed`). */
export interface OutboxEntry {
	id: string;
	event_id: string | null;
	user_id: string;
	customer_id: string | null;
	order_id: string;
	order_status: string;
	status: OutboxStatus;
	recipient: string | null;
	message_id: string;
	attempts: number;
	next_attempt_at: string | null;
	last_error: string | null;
	smtp_response: string | null;
	created_at: string;
	sent_at: string | null;
}

/** The contract of `users.emailPreference`. */
interface EmailPreference {
	userId: string;
	customerId: string | null;
	name: string | null;
	email: string | null;
	enabled: boolean;
}

const OutboxQuery = z.object({
	status: z.enum(OUTBOX_STATUSES, { message: `must be one of: ${OUTBOX_STATUSES.join(", ")}` }).optional(),
	limit: z.coerce.number({ message: "must be a whole number from 1 to 500" }).int().min(1).max(500).default(50),
});
type OutboxQuery = z.infer<typeof OutboxQuery>;

// Form posts and links carry strings only; other fields a mail provider might add are ignored.
const UnsubscribeToken = z.string({ message: "is required" }).min(1, "is required").max(MAX_UNSUBSCRIBE_TOKEN_LENGTH, "is not a valid unsubscribe token");
const UnsubscribePageParams = z.object({ token: z.string().max(MAX_UNSUBSCRIBE_TOKEN_LENGTH * 2).optional() });
type UnsubscribePageParams = z.infer<typeof UnsubscribePageParams>;
const UnsubscribeParams = z.object({
	token: UnsubscribeToken,
	"List-Unsubscribe": z.literal("One-Click", { message: "must be One-Click (RFC 8058)" }).optional(),
});
type UnsubscribeParams = z.infer<typeof UnsubscribeParams>;

const TOPIC_NAMES: Record<string, string> = { [TASKING_ORDER_STATUS.topic]: TASKING_ORDER_STATUS.name };

interface NotifierMetrics {
	attempts: Counter<string>;
	finished: Counter<string>;
}

type NotifierThis = DbServiceThis & {
	transport: MailTransport;
	metrics: NotifierMetrics;
	unsubscribeKey: Uint8Array;
	publicBaseUrl(): string;
	workerId: string;
	inFlight: Map<string, Promise<void>>;
	pollTimer: NodeJS.Timeout | null;
	heartbeatTimer: NodeJS.Timeout | null;
	polling: boolean;
	pollRequested: boolean;
	stopping: boolean;

	ingestOrderStatus(payload: unknown): Promise<void>;
	recordEmail(event: TaskingOrderStatusEvent): Promise<void>;
	recordRejected(payload: unknown, errors: FieldProblem[]): Promise<void>;
	wakeWorker(delayMs?: number): void;
	pollOutbox(): Promise<void>;
	claimDue(limit: number): Promise<OutboxRow[]>;
	processEmail(row: OutboxRow): Promise<void>;
	composeEmail(row: OutboxRow, preference: EmailPreference & { email: string }): Promise<ComposedEmail>;
	settle(row: OutboxRow, changes: Partial<OutboxRow>, onlyIfStillOurs: boolean): Promise<void>;
	retryOrFail(row: OutboxRow, error: string, permanent: boolean): Promise<void>;
	renewLeases(): Promise<void>;
	topicName(topic: string): string;
	toEntry(row: OutboxRow): OutboxEntry;
};

/** When retry number `attemptsMade` is due (offsets count from the first attempt), or null when none is left. */
export function nextAttemptAt(firstAttemptAt: string, attemptsMade: number, schedule: number[], now: number): string | null {
	if (attemptsMade > schedule.length) return null;
	return new Date(Math.max(now, Date.parse(firstAttemptAt) + schedule[attemptsMade - 1])).toISOString();
}

/**
 * The outbox key of an event: its event_id, or, for an event sent without one, a digest of what
 * identifies the notification, so that a repeat of that event is still recognised.
 */
export function eventKeyOf(event: TaskingOrderStatusEvent): string {
	if (event.event_id) return event.event_id;
	const identity = JSON.stringify([event.user_id, event.order_id, event.status, event.occurred_at ?? null]);
	return `sha256:${crypto.createHash("sha256").update(identity).digest("hex")}`;
}

function isoAfter(ms: number, from = Date.now()): string {
	return new Date(from + ms).toISOString();
}

function truncate(text: string, max: number): string {
	return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

const NotifierService: ServiceSchema<ServiceSettingSchema, NotifierThis> = {
	name: "notifier",
	mixins: [
		DbMixin("notifier", notifierMigrations) as Partial<ServiceSchema>,
		OrderStatusIntakeMixin("notifier"),
		NotifierBacklogMixin,
		// RETENTION_PERIOD: sent, failed and skipped emails and rejected events; pending ones stay.
		RetentionMixin([
			oldestRowsJob("email_outbox", "email_outbox", "id", "created_at", finished => finished.whereIn("status", ["sent", "failed", "skipped"])),
			oldestRowsJob("email_rejected_events", "email_rejected_events", "id", "received_at"),
		]) as Partial<ServiceSchema>,
	],

	actions: {
		/** Operators' view of the outbox, newest first. Tokens are never stored, so never shown. */
		outbox: {
			params: zodParams(OutboxQuery),
			async handler(this: NotifierThis, ctx: Context<OutboxQuery>): Promise<OutboxEntry[]> {
				const query = this.db<OutboxRow>("email_outbox").select().orderBy([
					{ column: "created_at", order: "desc" },
					{ column: "id", order: "desc" },
				]);
				if (ctx.params.status) query.where("status", ctx.params.status);
				const rows: OutboxRow[] = await query.limit(ctx.params.limit);
				return rows.map(row => this.toEntry(row));
			},
		},

		/** GET /email/unsubscribe: a confirmation page. Never unsubscribes (link scanners open links). */
		unsubscribePage: {
			params: zodParams(UnsubscribePageParams),
			async handler(this: NotifierThis, ctx: Context<UnsubscribePageParams, GatewayMeta>): Promise<string> {
				ctx.meta.$responseType = "text/html; charset=utf-8";
				ctx.meta.$responseHeaders = { ...UNSUBSCRIBE_PAGE_HEADERS };
				try {
					const claims = await verifyUnsubscribeToken(ctx.params.token ?? "", this.unsubscribeKey);
					return confirmUnsubscribePage(this.topicName(claims.topic));
				} catch (err) {
					if (!(err instanceof InvalidUnsubscribeTokenError)) throw err;
					ctx.meta.$statusCode = 422;
					return invalidLinkPage(err.message);
				}
			},
		},

		/**
		 * POST /email/unsubscribe: RFC 8058 one-click (body `List-Unsubscribe=One-Click`) and the
		 * confirmation page's button. Idempotent. A bad or expired token is a 422 and changes nothing.
		 */
		unsubscribe: {
			params: zodParams(UnsubscribeParams),
			async handler(this: NotifierThis, ctx: Context<UnsubscribeParams, GatewayMeta>): Promise<string> {
				let claims;
				try {
					claims = await verifyUnsubscribeToken(ctx.params.token, this.unsubscribeKey);
				} catch (err) {
					if (err instanceof InvalidUnsubscribeTokenError) throw invalidField("token", err.message);
					throw err;
				}
				await ctx.call("users.setEmailPreference", { userId: claims.userId, topic: claims.topic, email: false });
				this.logger.info(`User ${claims.userId} unsubscribed from ${claims.topic} emails`);
				ctx.meta.$responseType = "text/html; charset=utf-8";
				ctx.meta.$responseHeaders = { ...UNSUBSCRIBE_PAGE_HEADERS };
				return unsubscribedPage(this.topicName(claims.topic));
			},
		},
	},

	methods: {
		/**
		 * Intake (see mixins/order-status-intake.mixin.ts): an invalid event is recorded as
		 * rejected, an email-worthy one becomes an outbox row. Throws only on a dependency failure.
		 */
		async ingestOrderStatus(this: NotifierThis, payload: unknown): Promise<void> {
			const parsed = TaskingOrderStatusEvent.safeParse(payload);
			if (!parsed.success) {
				await this.recordRejected(payload, issuesToProblems(parsed.error));
				return;
			}
			const event = parsed.data;
			if (!EMAIL_STATUSES.has(event.status)) return;
			await this.recordEmail(event);
			this.wakeWorker();
		},

		/** Adds the email to the outbox, once per (event, user): a repeat inserts nothing. */
		async recordEmail(this: NotifierThis, event: TaskingOrderStatusEvent): Promise<void> {
			const now = nowIso();
			const eventKey = eventKeyOf(event);
			const snapshot: OrderSnapshot = {
				order_id: event.order_id,
				status: event.status,
				previous_status: event.previous_status,
				order_name: event.order_name,
				occurred_at: event.occurred_at ? new Date(event.occurred_at).toISOString() : now,
				details: event.details,
			};
			await this.db("email_outbox")
				.insert({
					id: crypto.randomUUID(),
					event_key: eventKey,
					event_id: event.event_id ?? null,
					user_id: event.user_id,
					customer_id: event.customer_id ?? null,
					// PostgreSQL text cannot hold NUL; the snapshot keeps the exact id (JSON escapes it).
					order_id: event.order_id.replaceAll("\u0000", "\ufffd"),
					order_status: event.status,
					order_snapshot: JSON.stringify(snapshot),
					message_id: messageIdFor(eventKey, event.user_id, this.config.MAIL_FROM),
					status: "pending",
					attempts: 0,
					next_attempt_at: now,
					created_at: now,
					updated_at: now,
				})
				.onConflict(["event_key", "user_id"])
				.ignore();
		},

		async recordRejected(this: NotifierThis, payload: unknown, errors: FieldProblem[]): Promise<void> {
			this.logger.warn(`Rejected a tasking.order_status event: ${errors.map(error => `${error.path || "(event)"}: ${error.message}`).join("; ")}`);
			let text: string;
			try {
				text = JSON.stringify(payload) ?? String(payload);
			} catch {
				text = String(payload);
			}
			await this.db("email_rejected_events").insert({
				id: crypto.randomUUID(),
				received_at: nowIso(),
				errors: JSON.stringify(errors),
				payload: truncate(text, MAX_REJECTED_PAYLOAD_CHARS),
			});
		},

		/**
		 * Where links in emails point. Asked at send time: with PORT=0 the gateway's real port is
		 * known only once it listens (app.ts records it).
		 */
		publicBaseUrl(this: NotifierThis): string {
			const config = this.config;
			return (config.PUBLIC_BASE_URL ?? config.boundBaseUrl ?? `http://localhost:${config.PORT}`).replace(/\/+$/, "");
		},

		wakeWorker(this: NotifierThis, delayMs = 0): void {
			if (this.stopping) return;
			if (this.polling) {
				this.pollRequested = true;
				return;
			}
			if (this.pollTimer) clearTimeout(this.pollTimer);
			this.pollTimer = setTimeout(() => void this.pollOutbox(), delayMs);
		},

		async pollOutbox(this: NotifierThis): Promise<void> {
			this.pollTimer = null;
			if (this.stopping) return;
			this.polling = true;
			this.pollRequested = false;
			let claimedAll = false;
			try {
				const capacity = this.config.MAIL_CONCURRENCY - this.inFlight.size;
				if (capacity > 0) {
					const rows = await this.claimDue(capacity);
					claimedAll = rows.length === capacity;
					for (const row of rows) {
						const work = this.processEmail(row)
							.catch(err => this.logger.error(`Email ${row.id} could not be processed; its lease will expire and it will be retried`, err))
							.finally(() => {
								this.inFlight.delete(row.id);
								this.wakeWorker();
							});
						this.inFlight.set(row.id, work);
					}
				}
			} catch (err) {
				this.logger.warn("Could not claim due emails; will try again", err);
			} finally {
				this.polling = false;
				// More may be due right away (a full batch, or an event that came in meanwhile).
				this.wakeWorker(claimedAll || this.pollRequested ? 0 : this.config.MAIL_POLL_INTERVAL);
			}
		},

		async claimDue(this: NotifierThis, limit: number): Promise<OutboxRow[]> {
			const now = nowIso();
			const due = this.db("email_outbox")
				.select("id")
				.where("status", "pending")
				.andWhere("next_attempt_at", "<=", now)
				.andWhere(builder => builder.whereNull("lease_until").orWhere("lease_until", "<", now))
				.orderBy("next_attempt_at")
				.limit(limit);
			// Several notifier processes on PostgreSQL each take different rows; SQLite has one writer.
			if (isPostgres(this.db)) due.forUpdate().skipLocked();
			// A CTE, not `id IN (subquery)`: PostgreSQL may run such a subquery more than once and
			// then update more rows than the LIMIT.
			return this.db
				.with("due", due)
				.table("email_outbox")
				.whereIn("id", this.db("due").select("id"))
				.andWhere("status", "pending")
				.update({
					lease_owner: this.workerId,
					lease_until: isoAfter(this.config.MAIL_LEASE),
					// Counted before sending, so a crash mid-send still uses up an attempt.
					attempts: this.db.raw("attempts + 1"),
					first_attempt_at: this.db.raw("coalesce(first_attempt_at, ?)", [now]),
					updated_at: now,
				})
				.returning("*") as Promise<OutboxRow[]>;
		},

		async processEmail(this: NotifierThis, row: OutboxRow): Promise<void> {
			if (row.attempts > this.config.MAIL_RETRY_SCHEDULE.length + 1) {
				// Only reachable when the process died during every attempt so far.
				await this.settle(row, { status: "failed", last_error: truncate(`gave up after ${row.attempts - 1} attempts: ${row.last_error ?? "the sender stopped each time"}`, MAX_ERROR_CHARS) }, true);
				return;
			}
			let preference: EmailPreference;
			try {
				preference = await this.broker.call<EmailPreference, { userId: string; topic: string }>(
					"users.emailPreference",
					{ userId: row.user_id, topic: TASKING_ORDER_STATUS_TOPIC },
					{ timeout: USERS_CALL_TIMEOUT_MS },
				);
			} catch (err) {
				if (isDependencyFailure(err)) {
					// The users service is restarting, slow, or not yet discovered by this node: no
					// fault of the email, so the attempt is given back and the email waits a moment.
					this.logger.warn(`Email ${row.id} waits: the users service did not answer (${(err as Error).message})`);
					await this.settle(row, { attempts: Number(row.attempts) - 1, next_attempt_at: isoAfter(USERS_UNAVAILABLE_WAIT_MS), last_error: truncate(`the users service did not answer: ${(err as Error).message}`, MAX_ERROR_CHARS) }, true);
					return;
				}
				await this.retryOrFail(row, `could not read the user's email preference: ${(err as Error).message}`, false);
				return;
			}
			// Asked again on every attempt: someone who turned email off meanwhile gets nothing.
			if (!preference.enabled || !preference.email) {
				const reason = preference.enabled ? "the user has no email address" : "email notifications are off for this user";
				await this.settle(row, { status: "skipped", last_error: reason }, true);
				this.metrics.finished.inc({ status: "skipped" });
				return;
			}
			const recipient = preference.email;
			let email: ComposedEmail;
			try {
				email = await this.composeEmail(row, { ...preference, email: recipient });
			} catch (err) {
				await this.retryOrFail(row, `could not compose the email: ${(err as Error).message}`, true);
				return;
			}
			try {
				const outcome = await this.transport.send(email);
				// Recorded first thing after the server accepted the message: this UPDATE is the whole
				// window in which a crash would cause a resend.
				await this.settle(row, { status: "sent", recipient, smtp_response: truncate(outcome.response, 500), sent_at: nowIso(), last_error: null }, false);
				this.metrics.attempts.inc({ result: "sent" });
				this.metrics.finished.inc({ status: "sent" });
			} catch (err) {
				const failure = classifySendError(err);
				await this.retryOrFail({ ...row, recipient }, failure.message, failure.permanent);
			}
		},

		async composeEmail(this: NotifierThis, row: OutboxRow, preference: EmailPreference & { email: string }): Promise<ComposedEmail> {
			const token = await signUnsubscribeToken({ userId: row.user_id, topic: TASKING_ORDER_STATUS_TOPIC }, this.unsubscribeKey, this.config.UNSUBSCRIBE_TOKEN_TTL);
			return buildOrderStatusEmail({
				eventKey: row.event_key,
				userId: row.user_id,
				recipient: { name: preference.name, address: preference.email },
				order: JSON.parse(row.order_snapshot) as OrderSnapshot,
				from: this.config.MAIL_FROM,
				topicName: this.topicName(TASKING_ORDER_STATUS_TOPIC),
				links: {
					unsubscribe: `${this.publicBaseUrl()}/email/unsubscribe?token=${encodeURIComponent(token)}`,
					settingsApi: `${this.publicBaseUrl()}/id/v3/user/settings`,
					preferencesPage: this.config.MAIL_PREFERENCES_URL,
				},
			});
		},

		/**
		 * Ends an attempt and releases the lease. "sent" is written unconditionally (the email did
		 * go out); other outcomes only while the row is still ours, so a worker that lost its
		 * lease cannot overwrite the outcome of the one that took over.
		 */
		async settle(this: NotifierThis, row: OutboxRow, changes: Partial<OutboxRow>, onlyIfStillOurs: boolean): Promise<void> {
			const query = this.db("email_outbox").where("id", row.id);
			if (onlyIfStillOurs) query.andWhere("lease_owner", this.workerId).andWhere("status", "pending");
			await query.update({ ...changes, lease_owner: null, lease_until: null, updated_at: nowIso() });
		},

		async retryOrFail(this: NotifierThis, row: OutboxRow, error: string, permanent: boolean): Promise<void> {
			const retryAt = permanent ? null : nextAttemptAt(row.first_attempt_at ?? row.updated_at, row.attempts, this.config.MAIL_RETRY_SCHEDULE, Date.now());
			const last_error = truncate(error, MAX_ERROR_CHARS);
			this.metrics.attempts.inc({ result: retryAt ? "retry" : "failed" });
			if (retryAt) {
				this.logger.warn(`Email ${row.id} attempt ${row.attempts} failed, retrying at ${retryAt}: ${last_error}`);
				await this.settle(row, { next_attempt_at: retryAt, last_error, recipient: row.recipient }, true);
			} else {
				this.logger.error(`Email ${row.id} failed after ${row.attempts} attempt(s): ${last_error}`);
				await this.settle(row, { status: "failed", last_error, recipient: row.recipient }, true);
				this.metrics.finished.inc({ status: "failed" });
			}
		},

		/** Keeps our claims alive while sends run, so no other worker takes over a live send. */
		async renewLeases(this: NotifierThis): Promise<void> {
			const ids = [...this.inFlight.keys()];
			if (ids.length === 0) return;
			try {
				await this.db("email_outbox")
					.whereIn("id", ids)
					.andWhere("lease_owner", this.workerId)
					.andWhere("status", "pending")
					.update({ lease_until: isoAfter(this.config.MAIL_LEASE) });
			} catch (err) {
				this.logger.warn("Could not renew email leases", err);
			}
		},

		topicName(this: NotifierThis, topic: string): string {
			return TOPIC_NAMES[topic] ?? topic;
		},

		toEntry(this: NotifierThis, row: OutboxRow): OutboxEntry {
			return {
				id: row.id,
				event_id: row.event_id,
				user_id: row.user_id,
				customer_id: row.customer_id,
				order_id: row.order_id,
				order_status: row.order_status,
				status: row.status,
				recipient: row.recipient,
				message_id: row.message_id,
				attempts: Number(row.attempts),
				next_attempt_at: row.status === "pending" ? row.next_attempt_at : null,
				last_error: row.last_error,
				smtp_response: row.smtp_response,
				created_at: row.created_at,
				sent_at: row.sent_at,
			};
		},
	},

	created(this: NotifierThis) {
		// this.config is set by DbMixin's created hook, which runs before this one.
		const config = this.config;
		if (!senderDomain(config.MAIL_FROM)) throw new ConfigError(`Invalid configuration: MAIL_FROM: "${config.MAIL_FROM}" has no usable email address`);
		if (!config.SECRETS_KEY) throw new ConfigError("Invalid configuration: SECRETS_KEY is required to sign unsubscribe links");
		if (config.production && !config.PUBLIC_BASE_URL) {
			throw new ConfigError("Invalid configuration: NODE_ENV=production requires PUBLIC_BASE_URL, the address the unsubscribe links in emails point to");
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
		};
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
