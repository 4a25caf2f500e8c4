// A webhook's rate limit (API.md `rate_limit`), the part with no database in sight: the send
// times an instance holds for each limited webhook. Send times are handed out by a schedule kept
// in the database for the webhook as a whole (the dispatcher's webhook_rate_slots, one row per
// webhook: the next free time), so that every instance's sends together keep to one spacing of
// 1 s / limit. An instance reserves a few slots at a time, about RESERVE_AHEAD_MS worth, only while
// it has deliveries of the webhook waiting.
//
// A slot not used in time is dropped rather than used late: late sends beside another instance's
// punctual ones would bunch up. So a busy instance may send a little below the limit, never above.
// "In time" is checked twice: when the send loop takes the slot, and again where the request
// starts (a sender thread, which may wait for a core), the start that attempted_at records.

/** How much of the webhook's schedule one reservation takes: 100 ms of sends. */
export const RESERVE_AHEAD_MS = 100;
/** A slot missed by more than this is dropped: the excess of a one-second window is at most this much of sends. */
export const SLOT_GRACE_MS = 25;

/** The latest time an attempt on the slot of `slotAt` may start. */
export const latestStartOf = (slotAt: number) => slotAt + SLOT_GRACE_MS;

/** Milliseconds between two sends of a webhook limited to `limit` a second. */
export const spacingOf = (limit: number) => 1_000 / limit;

/** How many slots to reserve: RESERVE_AHEAD_MS worth of the limit, at least one, and no more than are waiting. */
export function slotsToReserve(limit: number, waiting: number): number {
	return Math.max(1, Math.min(waiting, Math.floor((limit * RESERVE_AHEAD_MS) / 1_000)));
}

/**
 * How far the database's clock is ahead of this one (ms), from reservations' answers. A sample
 * brackets it: the database read its clock after `before` and before `after` (local times), so
 * the offset lies within [dbNow - after, dbNow - before]. Taking `dbNow - after` alone would put
 * each reservation's slots late by however long its answer took (a commit, a busy event loop),
 * by a different amount each time, and slots of different instances would then crowd together.
 * The largest lower bound seen is used instead: late by the quickest answer only, and by the
 * same amount for every reservation. A sample whose upper bound falls below it means this clock
 * was stepped forward; the estimate starts again from that sample.
 */
export class ClockOffset {
	private lower: number | null = null;

	/** Adds a sample and returns the local time of the database time `dbTime`. */
	toLocal(dbTime: number, sample: { before: number; dbNow: number; after: number }): number {
		const lower = sample.dbNow - sample.after;
		const upper = sample.dbNow - sample.before;
		this.lower = this.lower === null || upper < this.lower ? lower : Math.max(this.lower, lower);
		return dbTime - this.lower;
	}
}

interface WebhookSlots {
	limit: number;
	/** Local times (epoch ms) at which this instance may send, oldest first. */
	times: number[];
	reserving: boolean;
}

export class RateSlots {
	private readonly webhooks = new Map<string, WebhookSlots>();
	/** The database's clock, which the shared schedule runs on (PostgreSQL). */
	readonly databaseClock = new ClockOffset();

	/**
	 * Takes a slot due by `now`, dropping those missed, and returns its time; null when the next is
	 * later or none is held.
	 */
	take(webhookId: string, limit: number, now: number): number | null {
		const slots = this.slotsOf(webhookId, limit);
		while (slots.times.length > 0 && slots.times[0] < now - SLOT_GRACE_MS) slots.times.shift();
		if (slots.times.length === 0 || slots.times[0] > now) return null;
		return slots.times.shift()!;
	}

	/** The time of the webhook's next held slot, or null when it holds none. */
	nextAt(webhookId: string): number | null {
		return this.webhooks.get(webhookId)?.times[0] ?? null;
	}

	/** Whether a reservation is worth starting: none held and none under way. */
	needsReservation(webhookId: string, limit: number): boolean {
		const slots = this.slotsOf(webhookId, limit);
		return slots.times.length === 0 && !slots.reserving;
	}

	/** Marks a reservation as under way, so that only one runs per webhook. */
	reserving(webhookId: string, limit: number): void {
		this.slotsOf(webhookId, limit).reserving = true;
	}

	/**
	 * The reservation answered: `count` slots from `firstAt` (local time), spaced by the limit.
	 * Slots of a limit that changed meanwhile are not kept.
	 */
	reserved(webhookId: string, limit: number, firstAt: number, count: number): void {
		const slots = this.slotsOf(webhookId, limit);
		slots.reserving = false;
		if (slots.limit !== limit) return;
		const spacing = spacingOf(limit);
		for (let i = 0; i < count; i += 1) slots.times.push(firstAt + i * spacing);
	}

	/** The reservation failed: the next pump tries again. */
	failed(webhookId: string): void {
		const slots = this.webhooks.get(webhookId);
		if (slots) slots.reserving = false;
	}

	/** The webhook's limit changed, or it was removed: its held slots were spaced for the old one. */
	forget(webhookId: string): void {
		this.webhooks.delete(webhookId);
	}

	private slotsOf(webhookId: string, limit: number): WebhookSlots {
		let slots = this.webhooks.get(webhookId);
		if (!slots || (slots.limit !== limit && !slots.reserving)) {
			slots = { limit, times: [], reserving: false };
			this.webhooks.set(webhookId, slots);
		}
		return slots;
	}
}
