// Notifier worker, the send loop: due outbox rows are claimed with a lease (FOR UPDATE SKIP
// LOCKED on PostgreSQL), up to MAIL_CONCURRENCY at a time. For each, the owner's preference is
// asked from `users` on every attempt, the email is composed (with a fresh unsubscribe link) and
// sent through the mail transport, then settled: sent, skipped, retried on MAIL_RETRY_SCHEDULE
// or failed. Leases are renewed while sends run, so only a dead process loses its claims.
import { isPostgres, nowIso } from "../db.mixin";
import { isDependencyFailure } from "../../lib/errors";
import { TASKING_ORDER_STATUS_TOPIC } from "../../lib/schemas/events";
import { buildOrderStatusEmail, type ComposedEmail, type OrderSnapshot } from "../../lib/email-message";
import { classifySendError } from "../../lib/mail-transport";
import { signUnsubscribeToken } from "../../lib/unsubscribe-token";
import { noteEmailFailure, noteEmailResult, traceEmail } from "../../lib/tracing";
import {
	isoAfter,
	MAX_ERROR_CHARS,
	nextAttemptAt,
	truncate,
	USERS_CALL_TIMEOUT_MS,
	USERS_UNAVAILABLE_WAIT_MS,
	type EmailPreference,
	type NotifierMixin,
	type NotifierThis,
	type OutboxRow,
} from "./shared";

export const WorkerMixin: NotifierMixin = {
	methods: {
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
						const work = traceEmail(row, () => this.processEmail(row))
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
				noteEmailFailure(failure);
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
					// The gateway serves the web application, whose page changes these settings.
					preferencesPage: this.config.MAIL_PREFERENCES_URL ?? `${this.publicBaseUrl()}/notifications`,
				},
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

		/**
		 * Ends an attempt and releases the lease. "sent" is written unconditionally (the email did
		 * go out); other outcomes only while the row is still ours, so a worker that lost its
		 * lease cannot overwrite the outcome of the one that took over.
		 */
		async settle(this: NotifierThis, row: OutboxRow, changes: Partial<OutboxRow>, onlyIfStillOurs: boolean): Promise<void> {
			const query = this.db("email_outbox").where("id", row.id);
			if (onlyIfStillOurs) query.andWhere("lease_owner", this.workerId).andWhere("status", "pending");
			noteEmailResult(changes);
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
	},
};
