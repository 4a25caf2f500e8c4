// Notifier outbox: how an email enters the outbox and how operators see it. Intake (called by
// mixins/order-status-intake.mixin.ts) turns a valid event with a terminal status into one outbox
// row per (event, user), a repeat inserting nothing, and records an invalid event as rejected;
// the `outbox` action lists rows for the operators' REPL.
//
// An event whose user does not want the email (email off, no address, unknown to users) writes
// nothing: most events are of such users, and each row cost an insert, a claim, a users call and
// an update only to end `skipped`. Intake knows from a per-user cache of users.emailPreference
// (lib/email-preference-cache.ts), dropped on users.emailPreferenceChanged and whenever an
// announcement may have been missed. When users cannot answer, intake writes the row as before:
// the worker's check at send time decides, and no email is lost to an empty cache.
import crypto from "node:crypto";
import type { Context } from "moleculer";
import { z } from "zod";
import { nowIso } from "../db.mixin";
import { zodParams } from "../validation";
import { issuesToProblems } from "../../lib/zod-problems";
import type { FieldProblem } from "../../lib/errors";
import { isDependencyFailure } from "../../lib/errors";
import { EMAIL_STATUSES, TASKING_ORDER_STATUS_TOPIC, TaskingOrderStatusEvent } from "../../lib/schemas/events";
import { EMAIL_PREFERENCE_CHANGED_EVENT, type EmailPreferenceChangedEvent } from "../../lib/schemas/users";
import { messageIdFor, type OrderSnapshot } from "../../lib/email-message";
import {
	eventKeyOf,
	MAX_REJECTED_PAYLOAD_CHARS,
	OUTBOX_STATUSES,
	truncate,
	USERS_INTAKE_TIMEOUT_MS,
	type EmailPreference,
	type NotQueuedReason,
	type NotifierMixin,
	type NotifierThis,
	type OutboxEntry,
	type OutboxRow,
} from "./shared";
import { currentTraceContext } from "../../lib/tracing";

const OutboxQuery = z.object({
	status: z.enum(OUTBOX_STATUSES, { message: `must be one of: ${OUTBOX_STATUSES.join(", ")}` }).optional(),
	limit: z.coerce.number({ message: "must be a whole number from 1 to 500" }).int().min(1).max(500).default(50),
});
type OutboxQuery = z.infer<typeof OutboxQuery>;

/** An announcement may have been missed (this node or a peer was cut off), or a topic changed: nothing cached holds. */
function forgetAllPreferences(this: NotifierThis): void {
	this.emailPreferences.clear();
}

export const OutboxMixin: NotifierMixin = {
	events: {
		[EMAIL_PREFERENCE_CHANGED_EVENT](this: NotifierThis, ctx: Context<Partial<EmailPreferenceChangedEvent>>) {
			const userId = ctx.params?.userId;
			if (typeof userId === "string") this.emailPreferences.forget(userId);
			else this.emailPreferences.clear();
		},
		// Whether a topic has email at all is part of users.emailPreference's answer.
		"topics.changed": forgetAllPreferences,
		"$transporter.connected": forgetAllPreferences,
		"$node.connected": forgetAllPreferences,
		"$node.disconnected": forgetAllPreferences,
	},

	actions: {
		/**
		 * Acknowledged intake, for dispatcher.publish in the embedded mode (no channel there): the
		 * same ingest as the channel's and the event's, but a failure to persist reaches the caller,
		 * so that it answers an error instead of losing the email.
		 */
		accept: {
			visibility: "public",
			params: zodParams(z.unknown()),
			async handler(this: NotifierThis, ctx: Context<unknown>): Promise<{ accepted: true }> {
				await this.ingestOrderStatus(ctx.params);
				return { accepted: true };
			},
		},

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
			const unwanted = await this.unwantedEmailReason(event.user_id);
			if (unwanted) {
				this.metrics.notQueued.inc({ reason: unwanted });
				return;
			}
			await this.recordEmail(event);
			this.wakeWorker();
		},

		/**
		 * Why the user would not get the email (from the cache, or one users call on a miss), or
		 * null when they would, or when users could not say: then the row is written as before.
		 */
		async unwantedEmailReason(this: NotifierThis, userId: string): Promise<NotQueuedReason | null> {
			try {
				return await this.emailPreferences.get(userId, async () => {
					const preference = await this.broker.call<EmailPreference, { userId: string; topic: string }>(
						"users.emailPreference",
						{ userId, topic: TASKING_ORDER_STATUS_TOPIC },
						{ timeout: USERS_INTAKE_TIMEOUT_MS },
					);
					if (!preference.enabled) return "email_off";
					return preference.email ? null : "no_address";
				});
			} catch (err) {
				// The worker reports a users outage when it meets it; anything else is worth a word here.
				if (!isDependencyFailure(err)) this.logger.warn(`Could not read user ${userId}'s email preference at intake; the email is queued and checked again at send time`, err);
				return null;
			}
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
					trace_context: currentTraceContext(),
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
};
