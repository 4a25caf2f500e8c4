// Backlog views for operators and pagers, one mixin per owning service: `dispatcher.backlog`
// (pending deliveries, the oldest due one) and `notifier.backlog` (the email outbox by status,
// the oldest pending email). Each also publishes the figures as Prometheus gauges read at scrape
// time. One read answers every caller for BACKLOG_REFRESH (lib/config.ts), so scrapers and REPL
// users together cost at most a few indexed queries per interval, whatever the table sizes.
import type { Context, Service, ServiceSchema, ServiceSettingSchema } from "moleculer";
import type { Gauge } from "prom-client";
import type { Knex } from "knex";
import { z } from "zod";
import { zodParams } from "./validation";
import { nowIso } from "./db.mixin";
import { gaugeReadAtScrape } from "../lib/metrics";
import type { AppConfig } from "../lib/config";

const NoParams = z.object({}).strict();

export interface DeliveryBacklog {
	/** Deliveries not finished: due, scheduled for a retry, in flight or parked (webhook disabled). */
	pending: number;
	/** Pending deliveries whose time has come and that no dispatcher has claimed yet. */
	due: number;
	oldest_due_at: string | null;
	/** How long the oldest due delivery has waited past its due time (0 when none is due). */
	oldest_due_age_seconds: number;
	checked_at: string;
}

export const EMAIL_OUTBOX_STATUSES = ["pending", "sent", "failed", "skipped"] as const;

export interface EmailBacklog {
	by_status: Record<(typeof EMAIL_OUTBOX_STATUSES)[number], number>;
	oldest_pending_at: string | null;
	/** Age of the oldest email not yet sent (0 when none is pending). */
	oldest_pending_age_seconds: number;
	checked_at: string;
}

type BacklogThis<T> = Service & { db: Knex; config: AppConfig; backlogCache?: { at: number; value: Promise<T> } };
/** A backlog mixin's `this`: `readBacklog` feeds both its action and its gauges. */
type BacklogReaderThis<Counts, Backlog> = BacklogThis<Counts> & { readBacklog(): Promise<Backlog> };

type DeliveryCounts = Omit<DeliveryBacklog, "oldest_due_age_seconds">;
type EmailCounts = Omit<EmailBacklog, "oldest_pending_age_seconds">;

// Ages are worked out when answering, from the cached timestamp, so they keep growing between
// two database reads instead of standing still for the cache's lifetime.
const ageSeconds = (since: string | null) => (since ? Math.max(0, (Date.now() - Date.parse(since)) / 1000) : 0);
const withDeliveryAge = (counts: DeliveryCounts): DeliveryBacklog => ({ ...counts, oldest_due_age_seconds: ageSeconds(counts.oldest_due_at) });
const withEmailAge = (counts: EmailCounts): EmailBacklog => ({ ...counts, oldest_pending_age_seconds: ageSeconds(counts.oldest_pending_at) });

/** One cached read shared by every caller within BACKLOG_REFRESH; a failed read is not kept. */
function cachedRead<T>(service: BacklogThis<T>, read: () => Promise<T>): Promise<T> {
	const now = Date.now();
	if (service.backlogCache && now - service.backlogCache.at < service.config.BACKLOG_REFRESH) return service.backlogCache.value;
	const value = read();
	service.backlogCache = { at: now, value };
	value.catch(() => {
		if (service.backlogCache?.value === value) service.backlogCache = undefined;
	});
	return value;
}

/**
 * A gauge set from the backlog at scrape time. Every gauge reads through the same cache, so one
 * scrape makes one database read. A database that does not answer leaves the gauge as it was.
 */
function backlogGauge<T>(service: BacklogThis<unknown>, read: () => Promise<T>, name: string, help: string, labelNames: string[], set: (gauge: Gauge<string>, value: T) => void): void {
	gaugeReadAtScrape(service.broker, name, help, labelNames, async gauge => {
		try {
			set(gauge, await read());
		} catch (err) {
			service.logger.warn(`Gauge ${name} not refreshed: ${(err as Error).message}`);
		}
	});
}

async function readDeliveryBacklog(db: Knex): Promise<DeliveryCounts> {
	const now = nowIso();
	// One statement, so that the counts are of one moment: two queries on two connections could
	// show a due delivery beside a pending count of 0. The literal predicate lets SQLite use the
	// partial index of pending rows.
	const row = await db("deliveries")
		.whereRaw("status = 'pending'")
		.select(
			db.raw("COUNT(*) AS pending"),
			db.raw("COUNT(CASE WHEN next_attempt_at <= ? THEN 1 END) AS due", [now]),
			db.raw("MIN(CASE WHEN next_attempt_at <= ? THEN next_attempt_at END) AS oldest", [now]),
		)
		.first();
	return {
		pending: Number(row?.pending ?? 0),
		due: Number(row?.due ?? 0),
		oldest_due_at: (row?.oldest as string | null | undefined) ?? null,
		checked_at: now,
	};
}

async function readEmailBacklog(db: Knex): Promise<EmailCounts> {
	const now = nowIso();
	// One statement (see readDeliveryBacklog): each status's count and oldest row, of one moment.
	const rows: Array<{ status: string; count: number | string; oldest: string | null }> = await db("email_outbox")
		.select("status")
		.count({ count: "*" })
		.min({ oldest: "created_at" })
		.groupBy("status");
	const byStatus = Object.fromEntries(EMAIL_OUTBOX_STATUSES.map(status => [status, 0])) as EmailBacklog["by_status"];
	for (const row of rows) if (row.status in byStatus) byStatus[row.status as keyof typeof byStatus] = Number(row.count);
	const oldestAt = rows.find(row => row.status === "pending")?.oldest ?? null;
	return { by_status: byStatus, oldest_pending_at: oldestAt, checked_at: now };
}

const dispatcherBacklog: Partial<ServiceSchema<ServiceSettingSchema, BacklogReaderThis<DeliveryCounts, DeliveryBacklog>>> = {
	actions: {
		/** Pending deliveries and the oldest due one (cached for BACKLOG_REFRESH). */
		backlog: {
			params: zodParams(NoParams),
			handler(this: BacklogReaderThis<DeliveryCounts, DeliveryBacklog>, _ctx: Context): Promise<DeliveryBacklog> {
				return this.readBacklog();
			},
		},
	},
	methods: {
		async readBacklog(this: BacklogReaderThis<DeliveryCounts, DeliveryBacklog>): Promise<DeliveryBacklog> {
			return withDeliveryAge(await cachedRead(this, () => readDeliveryBacklog(this.db)));
		},
	},
	created(this: BacklogReaderThis<DeliveryCounts, DeliveryBacklog>) {
		const read = () => this.readBacklog();
		backlogGauge(this, read, "webhook_deliveries_pending", "Deliveries not finished yet (due, scheduled for a retry, in flight or parked)", [], (gauge, backlog) => gauge.set(backlog.pending));
		backlogGauge(this, read, "webhook_deliveries_due", "Pending deliveries whose time has come, not yet claimed by a dispatcher", [], (gauge, backlog) => gauge.set(backlog.due));
		backlogGauge(this, read, "webhook_delivery_oldest_due_age_seconds", "How long the oldest due delivery has waited past its due time (0 when none is due)", [], (gauge, backlog) =>
			gauge.set(backlog.oldest_due_age_seconds),
		);
	},
};

const notifierBacklog: Partial<ServiceSchema<ServiceSettingSchema, BacklogReaderThis<EmailCounts, EmailBacklog>>> = {
	actions: {
		/** The email outbox by status and the oldest pending email (cached for BACKLOG_REFRESH). */
		backlog: {
			params: zodParams(NoParams),
			handler(this: BacklogReaderThis<EmailCounts, EmailBacklog>, _ctx: Context): Promise<EmailBacklog> {
				return this.readBacklog();
			},
		},
	},
	methods: {
		async readBacklog(this: BacklogReaderThis<EmailCounts, EmailBacklog>): Promise<EmailBacklog> {
			return withEmailAge(await cachedRead(this, () => readEmailBacklog(this.db)));
		},
	},
	created(this: BacklogReaderThis<EmailCounts, EmailBacklog>) {
		const read = () => this.readBacklog();
		backlogGauge(this, read, "email_outbox_emails", "Emails in the outbox, by status (pending, sent, failed, skipped)", ["status"], (gauge, backlog) => {
			for (const [status, count] of Object.entries(backlog.by_status)) gauge.set({ status }, count);
		});
		backlogGauge(this, read, "email_outbox_oldest_pending_age_seconds", "Age of the oldest email not sent yet (0 when none is pending)", [], (gauge, backlog) =>
			gauge.set(backlog.oldest_pending_age_seconds),
		);
	},
};

export const DispatcherBacklogMixin = dispatcherBacklog as Partial<ServiceSchema>;
export const NotifierBacklogMixin = notifierBacklog as Partial<ServiceSchema>;
