// Dispatcher rate limits (API.md `rate_limit`): a limited webhook's queued deliveries start only
// at send times reserved from its schedule in the database (webhook_rate_slots), shared by every
// instance, so that the webhook as a whole gets at most its limit a second. Deliveries over the
// limit wait in the queue, holding their lease; one that waits too long for its lease goes back
// to the database unattempted (worker.mixin.ts), and one whose attempt could not start by its
// send time's deadline (a sender thread waiting for a core) goes back to the front of the queue
// for the next. None of these fails or spends a retry.
// lib/rate-slots.ts keeps the times this instance holds; here are the reservation and the timer
// that wakes the send loop at the next held time.
import type { Context } from "moleculer";
import { isPostgres } from "../db.mixin";
import { latestStartOf, slotsToReserve, spacingOf } from "../../lib/rate-slots";
import type { WebhookChangedEvent } from "../../lib/schemas/webhooks";
import type { DispatcherMixin, DispatcherThis } from "./shared";

// The schedule's clock is PostgreSQL's, so that instances on machines whose clocks differ still
// share one spacing; the answer carries the database's time, to turn it into local time.
const RESERVE_POSTGRES = `INSERT INTO webhook_rate_slots AS s (webhook_id, next_at)
	VALUES (?, EXTRACT(EPOCH FROM clock_timestamp()) * 1000 + ?)
	ON CONFLICT (webhook_id) DO UPDATE SET next_at = GREATEST(s.next_at, EXTRACT(EPOCH FROM clock_timestamp()) * 1000) + ?
	RETURNING next_at, EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS db_now`;
const RESERVE_SQLITE = `INSERT INTO webhook_rate_slots AS s (webhook_id, next_at) VALUES (?, ? + ?)
	ON CONFLICT (webhook_id) DO UPDATE SET next_at = MAX(s.next_at, ?) + ?
	RETURNING next_at`;

export const RateLimitsMixin: DispatcherMixin = {
	events: {
		"webhooks.updated": {
			handler(this: DispatcherThis, ctx: Context<Partial<WebhookChangedEvent>>) {
				const id = ctx.params?.id;
				if (typeof id === "string") this.rateSlots.forget(id);
			},
		},
		"webhooks.removed": {
			handler(this: DispatcherThis, ctx: Context<{ id?: unknown }>) {
				const id = ctx.params?.id;
				if (typeof id === "string") this.rateSlots.forget(id);
			},
		},
	},

	methods: {
		/**
		 * Takes a send time for a delivery of a limited webhook, and returns the latest time the
		 * attempt may start on it; null when none is due now. Then a reservation is started if none
		 * is held, and the send loop is woken at the next held time.
		 */
		takeSendTime(this: DispatcherThis, webhookId: string, limit: number, now: number): number | null {
			const slotAt = this.rateSlots.take(webhookId, limit, now);
			if (slotAt !== null) return latestStartOf(slotAt);
			if (this.rateSlots.needsReservation(webhookId, limit)) void this.reserveSlots(webhookId, limit, this.queues.get(webhookId)?.length ?? 1);
			const nextAt = this.rateSlots.nextAt(webhookId);
			if (nextAt !== null) this.wakeAt(nextAt);
			return null;
		},

		/** Reserves the next slots of the webhook's schedule for this instance, then runs the send loop. */
		async reserveSlots(this: DispatcherThis, webhookId: string, limit: number, waiting: number): Promise<void> {
			const count = slotsToReserve(limit, waiting);
			const span = count * spacingOf(limit);
			this.rateSlots.reserving(webhookId, limit);
			try {
				let firstAt: number;
				if (isPostgres(this.db)) {
					const before = Date.now();
					const result = await this.db.raw(RESERVE_POSTGRES, [webhookId, span, span]);
					const row = (result as { rows: Array<{ next_at: string | number; db_now: string | number }> }).rows[0];
					firstAt = this.rateSlots.databaseClock.toLocal(Number(row.next_at) - span, { before, dbNow: Number(row.db_now), after: Date.now() });
				} else {
					const now = Date.now();
					const [row] = (await this.db.raw(RESERVE_SQLITE, [webhookId, now, span, now, span])) as Array<{ next_at: number }>;
					firstAt = Number(row.next_at) - span;
				}
				this.rateSlots.reserved(webhookId, limit, firstAt, count);
			} catch (err) {
				this.rateSlots.failed(webhookId);
				this.logger.warn(`Could not reserve send times for rate-limited webhook ${webhookId}, will try again: ${(err as Error).message}`);
				this.wakeAt(Date.now() + 1_000);
				return;
			}
			this.pump();
		},

		/** Runs the send loop at `at` (epoch ms), or earlier if a wake-up is set for sooner. */
		wakeAt(this: DispatcherThis, at: number): void {
			if (this.stopping || (this.rateWake && this.rateWake.at <= at)) return;
			if (this.rateWake) clearTimeout(this.rateWake.timer);
			const timer = setTimeout(() => {
				this.rateWake = null;
				this.pump();
			}, Math.max(0, at - Date.now()));
			timer.unref();
			this.rateWake = { at, timer };
		},
	},
};
