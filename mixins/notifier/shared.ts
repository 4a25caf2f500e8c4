// The notifier's shared vocabulary: its tuning constants, the outbox rows it reads and writes and
// what operators see of them, the retry and event-key rules, and `NotifierThis`, the one type of
// `this` that services/notifier.service.ts and every mixin in this folder share.
import crypto from "node:crypto";
import type { ServiceSchema, ServiceSettingSchema } from "moleculer";
import type { Counter } from "prom-client";
import type { DbServiceThis } from "../db.mixin";
import type { FieldProblem } from "../../lib/errors";
import type { TaskingOrderStatusEvent } from "../../lib/schemas/events";
import type { ComposedEmail } from "../../lib/email-message";
import type { MailTransport } from "../../lib/mail-transport";
import type { EmailPreferenceCache } from "../../lib/email-preference-cache";

export const OUTBOX_STATUSES = ["pending", "sent", "failed", "skipped"] as const;
export type OutboxStatus = (typeof OUTBOX_STATUSES)[number];

export const USERS_CALL_TIMEOUT_MS = 10_000;
export const USERS_UNAVAILABLE_WAIT_MS = 2_000;
// Intake asks users.emailPreference only to avoid writing rows nobody will send; when users is
// slow it would rather write the row (the worker asks again) than hold the intake for long.
export const USERS_INTAKE_TIMEOUT_MS = 2_000;
// How long intake trusts a user's cached preference with no announcement. Changes are announced
// (users.emailPreferenceChanged) and a lost connection clears everything, so this bounds only an
// announcement missed otherwise, and only its costly direction: an "off" that is now "on" loses
// the emails of that window (an "on" now "off" costs a row the worker skips). 30 s keeps that
// window short while one load serves a busy user's events for long enough that the load's cost
// (~1 ms, a round trip and a read) vanishes per event.
export const EMAIL_PREFERENCE_TTL_MS = 30_000;
export const EMAIL_PREFERENCE_CACHE_USERS = 100_000;

/** Why intake wrote no outbox row for an email-worthy event (the label of emails_not_queued_total). */
export type NotQueuedReason = "email_off" | "no_address";
export const MAX_REJECTED_PAYLOAD_CHARS = 16 * 1024;
export const MAX_ERROR_CHARS = 1000;

export interface OutboxRow {
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
	/** The W3C traceparent of the event's trace (lib/tracing.ts), null with tracing off. */
	trace_context: string | null;
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
export interface EmailPreference {
	userId: string;
	customerId: string | null;
	name: string | null;
	email: string | null;
	enabled: boolean;
}

export interface NotifierMetrics {
	attempts: Counter<string>;
	finished: Counter<string>;
	notQueued: Counter<string>;
}

export type NotifierThis = DbServiceThis & {
	transport: MailTransport;
	metrics: NotifierMetrics;
	unsubscribeKey: Uint8Array;
	/** Per user: why they would not get the order-status email (null: they would). */
	emailPreferences: EmailPreferenceCache<NotQueuedReason | null>;
	workerId: string;
	inFlight: Map<string, Promise<void>>;
	pollTimer: NodeJS.Timeout | null;
	heartbeatTimer: NodeJS.Timeout | null;
	polling: boolean;
	pollRequested: boolean;
	stopping: boolean;

	// outbox.mixin.ts
	ingestOrderStatus(payload: unknown): Promise<void>;
	unwantedEmailReason(userId: string): Promise<NotQueuedReason | null>;
	recordEmail(event: TaskingOrderStatusEvent): Promise<void>;
	recordRejected(payload: unknown, errors: FieldProblem[]): Promise<void>;
	toEntry(row: OutboxRow): OutboxEntry;
	// worker.mixin.ts
	wakeWorker(delayMs?: number): void;
	pollOutbox(): Promise<void>;
	claimDue(limit: number): Promise<OutboxRow[]>;
	processEmail(row: OutboxRow): Promise<void>;
	composeEmail(row: OutboxRow, preference: EmailPreference & { email: string }): Promise<ComposedEmail>;
	publicBaseUrl(): string;
	settle(row: OutboxRow, changes: Partial<OutboxRow>, onlyIfStillOurs: boolean): Promise<void>;
	retryOrFail(row: OutboxRow, error: string, permanent: boolean): Promise<void>;
	renewLeases(): Promise<void>;
	// unsubscribe.mixin.ts
	topicName(topic: string): string;
};

/** A part of the notifier: its actions and methods, all run with `this` a notifier. */
export type NotifierMixin = Partial<ServiceSchema<ServiceSettingSchema, NotifierThis>>;

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

export function isoAfter(ms: number, from = Date.now()): string {
	return new Date(from + ms).toISOString();
}

export function truncate(text: string, max: number): string {
	return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}
