// Dispatcher claims: how deliveries that intake did not hand straight to the worker get sent.
// A poll loop (and claimSoon, whenever capacity frees up while a backlog waits) leases due rows:
// retries whose time has come, rows whose lease another instance abandoned, and rows of webhooks
// not waiting here. A webhook whose new rows intake left in the database (it held its share, or
// the worker was full) waits: it is refilled from its own rows, in order, as it frees half of its
// share, until a refill finds none left.
// A lease moves next_attempt_at to the lease expiry and sets a lease_id, so an abandoned lease
// just makes the row due again.
// PostgreSQL claims with FOR UPDATE SKIP LOCKED; SQLite has a single writer.
// Every PARKED_RECHECK_POLLS polls the poll also re-checks parked deliveries (parking.mixin.ts)
// and sweeps order queues left without a head (order-queues.mixin.ts).
import crypto from "node:crypto";
import { setImmediate as nextTurn } from "node:timers/promises";
import { isPostgres } from "../db.mixin";
import { chunks, rowsOf } from "../../lib/sql-rows";
import {
	CLAIMED_COLUMNS,
	MAX_CLAIM_BATCH,
	PARKED_RECHECK_POLLS,
	isTrue,
	type ClaimedBatch,
	type ClaimedRow,
	type DispatcherMixin,
	type DispatcherThis,
	type LeasedDelivery,
	type MessageRow,
} from "./shared";

// A claim looks at this many times as many due rows as it may lease, for the webhooks to take turns.
const CLAIM_LOOK_AHEAD = 4;
// The poll's claim reads only rows due since its last drained claim (scanFrom), less this margin;
// every this many polls it reads them all, in case something was missed (or left by an instance
// that died with rows of its waiting webhooks in the table).
const SCAN_MARGIN_MS = 1_000;
const FULL_SCAN_POLLS = 10;

export const ClaimsMixin: DispatcherMixin = {
	methods: {
		/** Reads all due rows now, however old, and claims them up to capacity. */
		async claimDue(this: DispatcherThis): Promise<void> {
			this.markBacklog();
			await this.claimPass();
		},

		/** One pass: probes, refills, and the claim of all due rows while a backlog may wait. */
		async claimPass(this: DispatcherThis): Promise<void> {
			if (this.claimRun || this.stopping) return;
			this.claimRun = this.claimUntilFull().finally(() => {
				this.claimRun = null;
				// Asked for while this pass was past its refills.
				if (this.refills.size > 0) this.claimSoon();
			});
			await this.claimRun;
		},

		async claimUntilFull(this: DispatcherThis): Promise<void> {
			try {
				while (!this.stopping) {
					// Probes first, each in a statement of its own: a probe is the only way a failing
					// endpoint that recovered is noticed, so it must not wait until the instance has room,
					// nor behind other webhooks' rows.
					for (const { webhookId, probeDue } of this.breakers.open(Date.now())) {
						if (probeDue && !this.heldByWebhook.has(webhookId)) this.takeClaimed(await this.claimRowsOf(webhookId, 1, this.breakers.probeTakesNewest(webhookId)));
					}
					await this.claimRefills();
					if (!this.backlog) return;
					const room = this.roomLeft();
					if (room <= 0) return;
					const limit = Math.min(room, MAX_CLAIM_BATCH);
					const seqBefore = this.claimSeq;
					const startedAt = Date.now();
					const dueSince = this.scanFrom;
					const { leased, filledWebhooks } = this.takeClaimed(await this.claimBatch(limit, dueSince));
					// Fewer than asked, and no webhook stopped at its share: nothing else is due but the
					// waiting webhooks' piles, which their refills take by their own index.
					if (leased.length === 0 || (leased.length < limit && filledWebhooks.length === 0)) {
						// A claim asked for meanwhile (markBacklog: rows freed or added) reads all due rows
						// at the next turn; otherwise the poll's next claims read only rows due since the
						// last full read that drained (scanFrom). Moving scanFrom on after the narrower
						// claims too cut their windows from about 6 s to 2 s in bursts of 100,000 whose rows
						// went the claim way, but not their time (docs/benchmarks.md, 2026-11-27 20:26), and
						// would leave a row passed over at its webhook's share for the full read.
						if (this.requestedAt <= seqBefore) {
							this.backlog = false;
							if (dueSince === null) this.scanFrom = startedAt - SCAN_MARGIN_MS;
							return;
						}
					}
					// SQLite answers synchronously, so without a turn of the event loop between claims a
					// pile of due rows kept requests and timers waiting: 10,000 recovered deliveries of a
					// disabled webhook (parked 32 per claim) held the loop for 3 s.
					await nextTurn();
				}
			} catch (err) {
				this.logger.error("Claiming due deliveries failed; will try again at the next poll", err);
			}
		},

		/**
		 * Claims, for each webhook asked for (requestRefill), its own oldest rows up to its share,
		 * through its own index. A webhook with a slow receiver is refilled this way every half
		 * share; the claim of all due rows would read past every excluded pile to find them.
		 */
		async claimRefills(this: DispatcherThis): Promise<void> {
			// Those asked for from here on wait for the next pass (a turn of the event loop later).
			const asked = [...this.refills];
			this.refills.clear();
			for (const webhookId of asked) {
				if (!this.waitingWebhooks.has(webhookId) || this.breakers.isOpen(webhookId)) continue;
				const shareLeft = this.webhookShare(webhookId) - (this.heldByWebhook.get(webhookId) ?? 0);
				// The instance is nearly full: what this refill cannot take, another takes once there is
				// room (roomFreed), as the webhook may not cross half its share again. It used to be left
				// to the claim of all due rows, which reads past every other webhook's pile: in a burst of
				// 100,000 the cluster's PostgreSQL read 490 rows per delivery, and 210 on one node.
				if (this.roomLeft() < shareLeft) this.shortRefills.add(webhookId);
				const room = Math.min(shareLeft, this.roomLeft(), MAX_CLAIM_BATCH);
				if (room <= 0) continue;
				const seqBefore = this.claimSeq;
				const { leased } = this.takeClaimed(await this.claimRowsOf(webhookId, room));
				if (leased.length === room) {
					// Stopped at the statement's limit, below the share: the rest at the next pass.
					if (room < shareLeft && room === MAX_CLAIM_BATCH) this.refills.add(webhookId);
					continue;
				}
				// Drained, unless intake left rows of it while the statement ran: then once more, right
				// away only if the webhook is still down to half the fixed share, or else at its next
				// crossing (releaseHold). Below a share grown large, "once more" right away took the few
				// rows intake had left meanwhile, again and again: 578 refills in 6 s of a latency round.
				if (!this.leftRowsSince(webhookId, seqBefore)) this.stopWaiting(webhookId);
				else if (this.wantsRefill(webhookId)) this.refills.add(webhookId);
			}
		},

		/** Counts a claim's leases as held and hands them to the worker. */
		takeClaimed(this: DispatcherThis, batch: ClaimedBatch): ClaimedBatch {
			for (const webhookId of batch.filledWebhooks) this.waitingWebhooks.add(webhookId);
			for (const delivery of batch.leased) {
				this.held += 1;
				this.heldByWebhook.set(delivery.webhookId, (this.heldByWebhook.get(delivery.webhookId) ?? 0) + 1);
				this.enqueue(delivery);
			}
			this.pump();
			return batch;
		},

		/**
		 * One claim statement. No webhook gets more than its share of this instance's leases
		 * (webhookShare, queued + in flight): webhooks already at
		 * it are left out, and the others get at most what is left of theirs. Without the cap, a
		 * slow or failing receiver with a pile of due retries could take every lease of one claim,
		 * and the healthy webhooks' deliveries would wait until that pile was worked off.
		 * Webhooks with an open breaker are left out: their probes are claimed one by one
		 * (claimRowsOf), and their piles of due retries would hide other rows from the look-ahead.
		 * So are waiting webhooks: their refills take their piles by their own index. Taken here,
		 * in a burst of 100,000 in the cluster, the poll's pass claimed them 500 at a time until
		 * the burst had drained, each claim reading past every other pile (188 claims of 169 ms,
		 * 273 rows read and 368 µs of PostgreSQL per delivery; 58 claims of 36 ms, 137 rows and
		 * 284 µs without them).
		 */
		async claimBatch(this: DispatcherThis, limit: number, dueSince: number | null = null): Promise<ClaimedBatch> {
			const timer = this.metrics.claims.startTimer({ kind: "due" });
			try {
				return await this.claimDueRows(limit, dueSince);
			} finally {
				timer();
			}
		},

		async claimDueRows(this: DispatcherThis, limit: number, dueSince: number | null): Promise<ClaimedBatch> {
			const now = Date.now();
			const leaseId = crypto.randomUUID();
			const leaseExpiresAt = now + this.config.DELIVERY_LEASE;
			// Webhooks holding no lease here get the fixed share: what this claim finds is retries come
			// due and abandoned leases, while a burst's rows go the intake and refill ways.
			const share = this.webhookShare();
			// Open breakers (probes), waiting webhooks (refills) and webhooks at their share.
			const leftOut: string[] = [];
			const partly: Array<[string, number]> = [];
			for (const { webhookId } of this.breakers.open(now)) leftOut.push(webhookId);
			for (const webhookId of this.waitingWebhooks) if (!this.breakers.isOpen(webhookId)) leftOut.push(webhookId);
			for (const [webhookId, count] of this.heldByWebhook) {
				if (this.breakers.isOpen(webhookId) || this.waitingWebhooks.has(webhookId)) continue;
				const shareOf = this.webhookShare(webhookId);
				if (count >= shareOf) leftOut.push(webhookId);
				else partly.push([webhookId, shareOf - count]);
			}
			const exclude = leftOut.length ? `AND webhook_id NOT IN (${leftOut.map(() => "?").join(", ")})` : "";
			const roomOf = partly.length ? `CASE webhook_id ${partly.map(() => "WHEN ? THEN CAST(? AS integer)").join(" ")} ELSE CAST(? AS integer) END` : "CAST(? AS integer)";
			const skipLocked = isPostgres(this.db) ? "FOR UPDATE SKIP LOCKED" : "";
			const since = dueSince === null ? "" : "AND next_attempt_at > ?";
			// The due rows are picked once, in a materialised CTE: PostgreSQL may re-run a plain
			// `IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED)` subquery and so claim more than n.
			// More rows than the limit are looked at, and the webhooks take turns among them (each
			// one's oldest first), so that a pile of one webhook's rows does not hide the others'.
			const result = await this.db.raw(
				`WITH due AS MATERIALIZED (
					SELECT id, webhook_id, next_attempt_at FROM deliveries
					WHERE status = 'pending' AND next_attempt_at <= ? ${since} ${exclude}
					ORDER BY next_attempt_at
					LIMIT ? ${skipLocked}
				),
				turns AS (
					SELECT id, webhook_id, next_attempt_at, ROW_NUMBER() OVER (PARTITION BY webhook_id ORDER BY next_attempt_at, id) AS turn FROM due
				),
				chosen AS MATERIALIZED (
					SELECT id FROM turns WHERE turn <= ${roomOf} ORDER BY turn, next_attempt_at LIMIT ?
				)
				UPDATE deliveries SET lease_id = ?, next_attempt_at = ?
				WHERE id IN (SELECT id FROM chosen)
				RETURNING ${CLAIMED_COLUMNS}`,
				[new Date(now).toISOString(), ...(dueSince === null ? [] : [new Date(dueSince).toISOString()]), ...leftOut, limit * CLAIM_LOOK_AHEAD, ...partly.flat(), share, limit, leaseId, new Date(leaseExpiresAt).toISOString()],
			);
			const rows = rowsOf<ClaimedRow>(result);
			if (rows.length === 0) return { leased: [], filledWebhooks: [] };
			const leasedOf = new Map<string, number>();
			for (const row of rows) leasedOf.set(row.webhook_id, (leasedOf.get(row.webhook_id) ?? 0) + 1);
			const roomBefore = new Map(partly);
			const filledWebhooks = [...leasedOf]
				.filter(([webhookId, count]) => count >= (roomBefore.get(webhookId) ?? share))
				.map(([webhookId]) => webhookId);
			return { leased: await this.withBodies(rows, leaseId, leaseExpiresAt), filledWebhooks };
		},

		/**
		 * A webhook's oldest due rows, by its own index: a refill, or (limit 1) the probe of an
		 * open breaker, the row due longest, so that never-attempted rows are not passed over by
		 * retries; every other probe takes the never-attempted row due last instead (`newest`), fresh
		 * traffic when there is any (lib/endpoint-breaker.ts says why), and still never a retry
		 * before a delivery that has had no attempt yet. A statement of its own: within the main
		 * claim (a look-ahead sorted with every webhook's rows), a probe took 20-86 ms on SQLite.
		 */
		async claimRowsOf(this: DispatcherThis, webhookId: string, limit: number, newest = false): Promise<ClaimedBatch> {
			const timer = this.metrics.claims.startTimer({ kind: "webhook" });
			try {
				const batch = await this.claimRowsOfWebhook(webhookId, limit, newest);
				// No fresh delivery is due: the probe takes the row due longest after all.
				return newest && batch.leased.length === 0 ? await this.claimRowsOfWebhook(webhookId, limit, false) : batch;
			} finally {
				timer();
			}
		},

		async claimRowsOfWebhook(this: DispatcherThis, webhookId: string, limit: number, newest = false): Promise<ClaimedBatch> {
			const now = Date.now();
			const leaseId = crypto.randomUUID();
			const leaseExpiresAt = now + this.config.DELIVERY_LEASE;
			const skipLocked = isPostgres(this.db) ? "FOR UPDATE SKIP LOCKED" : "";
			// Materialised for the reason given in claimBatch.
			const result = await this.db.raw(
				`WITH chosen AS MATERIALIZED (
					SELECT id FROM deliveries WHERE webhook_id = ? AND status = 'pending' AND next_attempt_at <= ? ${newest ? "AND attempt_count = 0" : ""}
					ORDER BY ${newest ? "next_attempt_at DESC, id DESC" : "next_attempt_at, id"} LIMIT ? ${skipLocked}
				)
				UPDATE deliveries SET lease_id = ?, next_attempt_at = ?
				WHERE id IN (SELECT id FROM chosen)
				RETURNING ${CLAIMED_COLUMNS}`,
				[webhookId, new Date(now).toISOString(), limit, leaseId, new Date(leaseExpiresAt).toISOString()],
			);
			return { leased: await this.withBodies(rowsOf<ClaimedRow>(result), leaseId, leaseExpiresAt), filledWebhooks: [] };
		},

		/** The claimed rows as leased deliveries, oldest first, with their message bodies. */
		async withBodies(this: DispatcherThis, rows: ClaimedRow[], leaseId: string, leaseExpiresAt: number): Promise<LeasedDelivery[]> {
			const bodies = new Map<string, Pick<MessageRow, "body" | "trace_context">>();
			for (const eventIds of chunks([...new Set(rows.map(row => row.event_id))], 500)) {
				const messages: Array<Pick<MessageRow, "event_id" | "body" | "trace_context">> = await this.db("delivery_messages").whereIn("event_id", eventIds).select("event_id", "body", "trace_context");
				for (const message of messages) bodies.set(message.event_id, message);
			}
			// RETURNING promises no order; ids are time-ordered, so each webhook's rows go out oldest first.
			rows.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
			return rows.map(row => ({
				id: row.id,
				webhookId: row.webhook_id,
				body: bodies.get(row.event_id)!.body,
				traceContext: bodies.get(row.event_id)!.trace_context,
				leaseId,
				leaseExpiresAt,
				attemptCount: Number(row.attempt_count),
				firstAttemptAt: row.first_attempt_at,
				manualRetry: isTrue(row.manual_retry),
				orderKey: row.order_key,
			}));
		},

		claimSoon(this: DispatcherThis): void {
			// One claim per turn however many deliveries finished: SQLite answers within microtasks, so
			// each queued callback ran a whole claim before the next, and 57 empty claims queued by
			// one burst of finished deliveries held the event loop for 25 ms.
			if (this.stopping || this.claimQueued) return;
			this.claimQueued = true;
			setImmediate(() => {
				this.claimQueued = false;
				void this.claimPass();
			});
		},

		/** Due rows were added or freed: a claim now, and one more if a claim running now misses them. */
		requestClaim(this: DispatcherThis): void {
			this.markBacklog();
			this.claimSoon();
		},

		markBacklog(this: DispatcherThis): void {
			this.claimSeq += 1;
			this.requestedAt = this.claimSeq;
			this.backlog = true;
			this.scanFrom = null;
		},

		/**
		 * A delivery finished. Once half the instance's room is free, the backlog is claimed and the
		 * refills cut short for room go again: in batches, not one row per finished delivery, but
		 * early enough to keep every slot busy.
		 */
		roomFreed(this: DispatcherThis): void {
			if (this.roomLeft() < this.config.DELIVERY_CONCURRENCY / 2) return;
			const shortRefilled = this.shortRefills.size > 0;
			for (const webhookId of this.shortRefills) this.refills.add(webhookId);
			this.shortRefills.clear();
			if (this.backlog || shortRefilled) this.claimSoon();
		},

		/** A waiting webhook has half its share free: claim its own rows, not all due rows. */
		requestRefill(this: DispatcherThis, webhookId: string): void {
			this.refills.add(webhookId);
			this.claimSoon();
		},

		/** Whether intake left rows of the webhook in the database after claimSeq was at `seq`. */
		leftRowsSince(this: DispatcherThis, webhookId: string, seq: number): boolean {
			return (this.unleasedAt.get(webhookId) ?? 0) > seq;
		},

		/** The webhook has no rows left for a claim: intake may lease its new rows again. */
		stopWaiting(this: DispatcherThis, webhookId: string): void {
			this.waitingWebhooks.delete(webhookId);
			this.unleasedAt.delete(webhookId);
		},

		schedulePoll(this: DispatcherThis): void {
			if (this.stopping) return;
			this.pollTimer = setTimeout(async () => {
				this.polls += 1;
				// Claims of due rows leave waiting webhooks' piles to their refills, asked for as each
				// crosses half its share; one whose refill was lost (its statement failed) is asked again.
				for (const webhookId of this.waitingWebhooks) if (this.wantsRefill(webhookId)) this.refills.add(webhookId);
				// Retries come due by the clock: the poll claims whatever became due since its last claim.
				if (this.polls % FULL_SCAN_POLLS === 0) {
					await this.claimDue();
				} else {
					this.backlog = true;
					await this.claimPass();
				}
				if (this.polls % PARKED_RECHECK_POLLS === 0) {
					await this.recheckParked();
					await this.sweepHeadlessQueues();
					// Entries are only dropped when read; without this, every webhook ever seen would stay.
					const now = Date.now();
					for (const [id, cached] of this.targets) if (cached.expiresAt < now) this.targets.delete(id);
				} else if (this.headlessSweepDue) {
					await this.sweepHeadlessQueues();
				}
				this.schedulePoll();
			}, this.config.DELIVERY_POLL_INTERVAL);
		},
	},
};
