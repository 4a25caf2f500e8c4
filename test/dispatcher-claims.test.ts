// Claims share the leases out between webhooks: one webhook with a pile of due rows (a slow or
// failing receiver's retries) cannot take every lease of a claim, so the deliveries of the other
// webhooks are claimed in the same round instead of waiting until that pile is worked off.
import type { Knex } from "knex";
import { startStack, type Stack } from "./helpers/stack";
import { testDatabases, type DatabaseKind } from "./helpers/services";
import type { ClaimedBatch, Target } from "../mixins/dispatcher/shared";
import { waitUntil } from "./helpers/delivery-stack";
import { generateWebhookSecret } from "../lib/crypto";
import type { DrainRates } from "../lib/drain-rates";

// Share per webhook: DELIVERY_WEBHOOK_CONCURRENCY x WEBHOOK_LEASE_FACTOR (16) = 16.
const ENV = { DELIVERY_CONCURRENCY: "4", DELIVERY_WEBHOOK_CONCURRENCY: "1", DELIVERY_POLL_INTERVAL: "1h" };
const PILED = "11111111-1111-4111-8111-111111111111";
const HEALTHY = "22222222-2222-4222-8222-222222222222";
const DISABLED = "33333333-3333-4333-8333-333333333333";
const REFILLED = "44444444-4444-4444-8444-444444444444";
const LATE = "55555555-5555-4555-8555-555555555555";
const CROWDED = "66666666-6666-4666-8666-666666666666";
const WAITING = "77777777-7777-4777-8777-777777777777";
const FORGOTTEN = "88888888-8888-4888-8888-888888888888";
const REFILL_ONLY = "99999999-9999-4999-8999-999999999999";
const BESIDE = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa";
const FAST = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb";

interface ClaimingService {
	claimBatch(limit: number, dueSince?: number | null): Promise<ClaimedBatch>;
	claimRowsOf(webhookId: string, limit: number, newest?: boolean): Promise<ClaimedBatch>;
	claimDue(): Promise<void>;
	claimSoon(): void;
	claimUntilFull(): Promise<void>;
	claimRun: Promise<void> | null;
	claimQueued: boolean;
	cacheTarget(webhookId: string, target: Target | null): void;
	heldByWebhook: Map<string, number>;
	scanFrom: number | null;
	polls: number;
	held: number;
	backlog: boolean;
	waitingWebhooks: Set<string>;
	refills: Set<string>;
	shortRefills: Set<string>;
	roomFreed(): void;
	roomLeft(): number;
	pump(): void;
	webhookShare(webhookId?: string): number;
	drainRates: DrainRates;
	unleasedAt: Map<string, number>;
	claimSeq: number;
	claimRefills(): Promise<void>;
	markBacklog(): void;
}

/**
 * Lets a claim pass that earlier work queued (claimSoon runs on a later turn) or started finish. A
 * test that calls claimRefills itself goes around the pass's serialisation: run beside a pass,
 * both would read the same room in the instance.
 */
async function claimsSettled(dispatcher: ClaimingService): Promise<void> {
	do {
		await new Promise(resolve => setImmediate(resolve));
		await dispatcher.claimRun;
	} while (dispatcher.claimQueued || dispatcher.claimRun);
}

/** The webhooks and dispatcher services, once the claim the dispatcher makes as it starts is over. */
async function startClaimingStack(database: DatabaseKind, env: Record<string, string>): Promise<{ stack: Stack; dispatcher: ClaimingService }> {
	const stack = await startStack({ services: ["webhooks", "dispatcher"], database, env });
	const dispatcher = stack.app.broker.getLocalService("dispatcher") as unknown as ClaimingService;
	// On a busy machine that first claim could still be running when a test lays its rows down,
	// and lease them before the test's own claim.
	await claimsSettled(dispatcher);
	return { stack, dispatcher };
}

const inactiveTarget = (id: string): Target => ({ id, url: "https://receiver.example/hook", active: false, secrets: [generateWebhookSecret()], previousSecretExpiresAt: null, headers: {}, rateLimit: null });

/** `count` due deliveries of one webhook, one event each. */
async function seedDue(db: Knex, webhookId: string, count: number, ageMs: number): Promise<void> {
	const now = new Date().toISOString();
	const idOf = (i: number) => `${webhookId.slice(0, 24)}${String(i).padStart(12, "0")}`;
	await db("delivery_messages").insert(
		Array.from({ length: count }, (_, i) => ({ event_id: idOf(i), customer_id: "acme", user_id: "u-1", type: "tasking:order_status", body: "{}", occurred_at: now, created_at: now })),
	);
	await db("deliveries").insert(
		Array.from({ length: count }, (_, i) => ({
			id: idOf(i),
			event_id: idOf(i),
			webhook_id: webhookId,
			customer_id: "acme",
			status: "pending",
			// The piled-up rows are due longest, so an unbounded claim would take them first.
			next_attempt_at: new Date(Date.now() - ageMs - i).toISOString(),
			created_at: now,
			updated_at: now,
		})),
	);
}

describe.each(testDatabases())("claims on %s", database => {
	let stack: Stack;
	let dispatcher: ClaimingService;

	beforeAll(async () => {
		({ stack, dispatcher } = await startClaimingStack(database, ENV));
	});
	afterAll(() => stack?.stop());

	it("gives no webhook more than its share of leases in one claim, and says when one stopped there", async () => {
		await seedDue(stack.db, PILED, 40, 60_000);
		await seedDue(stack.db, HEALTHY, 2, 1_000);

		const { leased, filledWebhooks } = await dispatcher.claimBatch(32);
		const leasedOf = (webhookId: string) => leased.filter(delivery => delivery.webhookId === webhookId).length;
		expect(leasedOf(PILED)).toBe(16);
		expect(leasedOf(HEALTHY)).toBe(2);
		expect(filledWebhooks).toEqual([PILED]);
		const leasedRows = await stack.db("deliveries").whereNotNull("lease_id").select("id", "webhook_id");
		expect(leasedRows.map(row => row.id).sort()).toEqual(leased.map(delivery => delivery.id).sort());

		// A webhook that already holds part of its share gets only the rest of it.
		dispatcher.heldByWebhook.set(PILED, 13);
		try {
			const next = await dispatcher.claimBatch(32);
			expect(next.leased.map(delivery => delivery.webhookId)).toEqual([PILED, PILED, PILED]);
			expect(next.filledWebhooks).toEqual([PILED]);
			// At its share, a webhook is left out altogether.
			dispatcher.heldByWebhook.set(PILED, 16);
			expect((await dispatcher.claimBatch(32)).leased).toEqual([]);
		} finally {
			dispatcher.heldByWebhook.delete(PILED);
		}
	});

	it("takes a turn of the event loop between claims, so that a pile of due rows cannot hold requests and timers back", async () => {
		// A disabled webhook's rows are parked as soon as they are claimed, which frees its share at
		// once: 160 rows are 10 claims of 16, the first by the claim of all due rows, the rest by the
		// webhook's refills, a turn taking at most two of them (a refill and the claim of all due
		// rows). On SQLite every statement answers synchronously; without a turn between claims,
		// 10,000 recovered rows held the loop for 3 s.
		await seedDue(stack.db, DISABLED, 160, 1_000);
		dispatcher.cacheTarget(DISABLED, inactiveTarget(DISABLED));
		let turn = 0;
		let counting = true;
		const countTurn = () => {
			if (!counting) return;
			turn += 1;
			setImmediate(countTurn);
		};
		setImmediate(countTurn);
		// Claims counted by the turn they began in.
		const claimsInTurn = new Map<number, number>();
		const countClaim = () => claimsInTurn.set(turn, (claimsInTurn.get(turn) ?? 0) + 1);
		const { claimBatch, claimRowsOf } = dispatcher;
		dispatcher.claimBatch = (limit, dueSince) => (countClaim(), claimBatch(limit, dueSince));
		dispatcher.claimRowsOf = (webhookId, limit, newest) => (countClaim(), claimRowsOf(webhookId, limit, newest));
		const parked = async () => Number((await stack.db("deliveries").where({ webhook_id: DISABLED, parked: true }).count({ count: "*" }))[0].count);
		try {
			await dispatcher.claimDue();
			await waitUntil(parked, count => count === 160, "the claimed rows to be parked");
		} finally {
			counting = false;
			dispatcher.claimBatch = claimBatch;
			dispatcher.claimRowsOf = claimRowsOf;
		}
		const claims = [...claimsInTurn.values()].reduce((sum, count) => sum + count, 0);
		expect(claims).toBeGreaterThanOrEqual(10);
		// Turns and claims are counted by callbacks of the same phase, so a claim may be counted in the turn before its own.
		expect(claimsInTurn.size).toBeGreaterThanOrEqual(claims / 2);
	});

	it("runs one claim for any number of requests made in one turn", async () => {
		// Every finished delivery asks for a claim while a backlog waits. SQLite answers within
		// microtasks, so one queued claim per request ran them all back to back: 57 empty claims
		// after one burst of finished deliveries held the event loop for 25 ms.
		const claimUntilFull = dispatcher.claimUntilFull;
		let claims = 0;
		dispatcher.claimUntilFull = () => {
			claims += 1;
			return claimUntilFull();
		};
		try {
			for (let i = 0; i < 50; i += 1) dispatcher.claimSoon();
			for (let turn = 0; turn < 3; turn += 1) {
				await new Promise(resolve => setImmediate(resolve));
				await dispatcher.claimRun;
			}
		} finally {
			dispatcher.claimUntilFull = claimUntilFull;
		}
		expect(claims).toBe(1);
	});

	it("refills one webhook from its own due rows, oldest first, up to the limit", async () => {
		// A waiting webhook's refill reads its own index: no other webhook's rows, none not yet due.
		await seedDue(stack.db, REFILLED, 11, 1_000);
		await stack.db("deliveries").where({ id: `${REFILLED.slice(0, 24)}000000000000` }).update({ next_attempt_at: new Date(Date.now() + 60_000).toISOString() });
		const oldestFirst = (await stack.db("deliveries").where({ webhook_id: REFILLED }).whereNull("lease_id").orderBy("next_attempt_at").select("id")).map(row => row.id);

		const first = await dispatcher.claimRowsOf(REFILLED, 4);
		expect(first.leased.map(delivery => delivery.id)).toEqual(oldestFirst.slice(0, 4).sort());
		const rest = await dispatcher.claimRowsOf(REFILLED, 50);
		// The row due in a minute stays where it is.
		expect(rest.leased.map(delivery => delivery.id)).toEqual(oldestFirst.slice(4, 10).sort());
		expect(await stack.db("deliveries").where({ webhook_id: REFILLED }).whereNull("lease_id").pluck("id")).toEqual([oldestFirst[10]]);
	});

	it("leaves a waiting webhook's pile to its refill", async () => {
		// Its rows are taken by its own index; a claim of all due rows that took them read past every
		// other pile each time (in a burst of 100,000 in the cluster: 273 rows read per delivery).
		await seedDue(stack.db, REFILL_ONLY, 6, 60_000);
		await seedDue(stack.db, BESIDE, 2, 1_000);
		dispatcher.cacheTarget(REFILL_ONLY, inactiveTarget(REFILL_ONLY));
		dispatcher.waitingWebhooks.add(REFILL_ONLY);
		try {
			const { leased } = await dispatcher.claimBatch(32);
			expect(leased.map(delivery => delivery.webhookId)).toEqual([BESIDE, BESIDE]);
			const refill = await dispatcher.claimRowsOf(REFILL_ONLY, 16);
			expect(refill.leased).toHaveLength(6);
		} finally {
			dispatcher.waitingWebhooks.delete(REFILL_ONLY);
		}
	});

	it("keeps a webhook waiting for its refill when the poll's claim read only newer rows", async () => {
		// Between half its share and its share, a webhook is refilled only once it crosses half; its
		// pile is older than what the poll's claim reads on SQLite. Let go here, the pile would wait
		// for the poll's claim of all due rows, 10 polls later, while new rows went ahead of it.
		await seedDue(stack.db, WAITING, 10, 60_000);
		dispatcher.cacheTarget(WAITING, inactiveTarget(WAITING));
		dispatcher.heldByWebhook.set(WAITING, 10);
		dispatcher.held += 10;
		try {
			dispatcher.waitingWebhooks.add(WAITING);
			dispatcher.backlog = true;
			dispatcher.scanFrom = Date.now() - 1_000;
			await dispatcher.claimUntilFull();
			const [{ count: unclaimed }] = await stack.db("deliveries").where({ webhook_id: WAITING }).whereNull("lease_id").count({ count: "*" });
			expect(Number(unclaimed)).toBe(10);
			expect(dispatcher.waitingWebhooks.has(WAITING)).toBe(true);
			expect(dispatcher.backlog).toBe(false);
		} finally {
			dispatcher.heldByWebhook.delete(WAITING);
			dispatcher.held -= 10;
			dispatcher.waitingWebhooks.delete(WAITING);
		}
	});

	it("reads all due rows at once when a claim was asked for while the poll's narrower one ran", async () => {
		const dueSinces: Array<number | null> = [];
		const claimBatch = dispatcher.claimBatch;
		dispatcher.claimBatch = async (limit: number, dueSince?: number | null) => {
			dueSinces.push(dueSince ?? null);
			// Rows freed meanwhile (a retry by hand, a webhook enabled again) ask for a claim.
			if (dueSinces.length === 1) dispatcher.markBacklog();
			return claimBatch(limit, dueSince);
		};
		try {
			dispatcher.backlog = true;
			dispatcher.scanFrom = Date.now() - 1_000;
			await dispatcher.claimUntilFull();
			expect(dueSinces).toHaveLength(2);
			expect(dueSinces[0]).not.toBeNull();
			expect(dueSinces[1]).toBeNull();
		} finally {
			dispatcher.claimBatch = claimBatch;
		}
	});

	it("refills a fast webhook up to its own share, and again at once only while it is down to half the fixed share", async () => {
		// Its queue drained at 10 a second while busy: its share is 10 x 20.5 s (the default lease's
		// headroom, halved), not the fixed 16. Each refill below finds fewer rows than that, and
		// intake leaves one more meanwhile (as it does while a webhook waits). Asked for again at
		// once whatever the webhook held, a refill took those few rows again and again.
		dispatcher.drainRates.noteAttempt(FAST, true, true, 0);
		for (let at = 100; at <= 1_000; at += 100) dispatcher.drainRates.noteAttempt(FAST, true, true, at);
		expect(dispatcher.webhookShare(FAST)).toBe(205);
		dispatcher.cacheTarget(FAST, inactiveTarget(FAST));
		dispatcher.waitingWebhooks.add(FAST);
		const refillLeavingOneBehind = async (held: number) => {
			dispatcher.heldByWebhook.set(FAST, held);
			dispatcher.unleasedAt.set(FAST, dispatcher.claimSeq + 1);
			dispatcher.refills.add(FAST);
			await dispatcher.claimRefills();
		};
		const waitingInDatabase = async () => Number((await stack.db("deliveries").where({ webhook_id: FAST }).whereNull("lease_id").where("parked", false).count({ count: "*" }))[0].count);
		try {
			// Holding 20, above half the fixed share (8): the next refill waits for its crossing.
			await seedDue(stack.db, FAST, 30, 1_000);
			await refillLeavingOneBehind(20);
			expect(await waitingInDatabase()).toBe(0);
			expect(dispatcher.refills.has(FAST)).toBe(false);
			expect(dispatcher.waitingWebhooks.has(FAST)).toBe(true);
			// Holding 3, below it: no crossing is coming, so at once.
			await refillLeavingOneBehind(3);
			expect(dispatcher.refills.has(FAST)).toBe(true);
			expect(dispatcher.waitingWebhooks.has(FAST)).toBe(true);
		} finally {
			dispatcher.heldByWebhook.delete(FAST);
			dispatcher.refills.delete(FAST);
			dispatcher.waitingWebhooks.delete(FAST);
			dispatcher.unleasedAt.delete(FAST);
			dispatcher.drainRates.forget(FAST);
		}
	});

	it("refills again what a refill had no room for, once the instance has room", async () => {
		// The webhook is refilled as it crosses half its share; one refilled below half for want of
		// room in the instance would not cross it again, and its rows would wait for a full poll.
		// Left to a claim of all due rows instead, they cost a read past every other pile.
		// The worker is held while the refill's own leases are counted: the inactive webhook's
		// deliveries are parked at once, which frees their room, and roomFreed then sends the cut-short
		// refill again. Counted after that (in a loaded CI run on PostgreSQL), the two refills had
		// leased 8 of the 10 rows.
		await claimsSettled(dispatcher);
		const pump = dispatcher.pump;
		dispatcher.pump = () => undefined;
		await seedDue(stack.db, CROWDED, 10, 1_000);
		dispatcher.cacheTarget(CROWDED, inactiveTarget(CROWDED));
		const crowd = dispatcher.roomLeft() - 4;
		dispatcher.held += crowd;
		let crowded = true;
		try {
			dispatcher.waitingWebhooks.add(CROWDED);
			dispatcher.backlog = false;
			dispatcher.scanFrom = Date.now();
			await claimsSettled(dispatcher);
			dispatcher.refills.add(CROWDED);
			await dispatcher.claimRefills();
			const untouched = async () => Number((await stack.db("deliveries").where({ webhook_id: CROWDED }).whereNull("lease_id").where("parked", false).count({ count: "*" }))[0].count);
			expect(await untouched()).toBe(6);
			// No claim of all due rows was asked for.
			expect(dispatcher.backlog).toBe(false);
			expect(dispatcher.scanFrom).not.toBeNull();

			// Finished deliveries free the room: the refill goes again and takes the rest.
			dispatcher.pump = pump;
			dispatcher.held -= crowd;
			crowded = false;
			dispatcher.pump();
			dispatcher.roomFreed();
			await waitUntil(untouched, count => count === 0, "the rest of the crowded webhook's rows to be claimed");
			expect(dispatcher.shortRefills.size).toBe(0);
		} finally {
			dispatcher.pump = pump;
			if (crowded) dispatcher.held -= crowd;
			dispatcher.waitingWebhooks.delete(CROWDED);
		}
	});
});

describe.each(testDatabases())("the poll's claim on %s", database => {
	let stack: Stack;
	let dispatcher: ClaimingService;

	beforeAll(async () => {
		({ stack, dispatcher } = await startClaimingStack(database, { ...ENV, DELIVERY_POLL_INTERVAL: "50ms" }));
	});
	afterAll(() => stack?.stop());

	it("asks again for the refill of a waiting webhook that has none coming", async () => {
		// A refill is asked for as a waiting webhook crosses half its share; one lost (its statement
		// failed) would leave the webhook's rows to nothing, since claims of all due rows leave them out.
		await seedDue(stack.db, FORGOTTEN, 3, 1_000);
		dispatcher.cacheTarget(FORGOTTEN, inactiveTarget(FORGOTTEN));
		dispatcher.waitingWebhooks.add(FORGOTTEN);
		const parked = async () => Number((await stack.db("deliveries").where({ webhook_id: FORGOTTEN, parked: true }).count({ count: "*" }))[0].count);
		await waitUntil(parked, count => count === 3, "the forgotten webhook's rows to be refilled (and parked)");
		await waitUntil(() => dispatcher.waitingWebhooks.has(FORGOTTEN), waiting => !waiting, "the drained webhook to stop waiting");
	});

	it("reads only rows due since its last drained claim, and all due rows every 10th poll", async () => {
		// What a drained claim leaves due is excluded webhooks' piles, refilled by their own index;
		// the poll's claim reads past them only once in 10 polls (on SQLite that costs the event
		// loop, on PostgreSQL its CPU). A row due long ago that nothing refills (here: inserted
		// behind the dispatcher's back, as by an instance that died) waits for that.
		const claims: Array<{ poll: number; dueSince: number | null; ids: string[] }> = [];
		const claimBatch = dispatcher.claimBatch;
		dispatcher.claimBatch = async (limit: number, dueSince?: number | null) => {
			const batch = await claimBatch(limit, dueSince);
			claims.push({ poll: dispatcher.polls, dueSince: dueSince ?? null, ids: batch.leased.map(delivery => delivery.id) });
			return batch;
		};
		try {
			await waitUntil(() => dispatcher.scanFrom, from => from !== null, "a drained claim of the poll");
			dispatcher.cacheTarget(LATE, inactiveTarget(LATE));
			claims.length = 0;
			await seedDue(stack.db, LATE, 1, 60_000);
			const [lateId] = await stack.db("deliveries").where({ webhook_id: LATE }).pluck("id");
			await waitUntil(() => claims.some(claim => claim.ids.includes(lateId)), Boolean, "the late row to be claimed");

			const taking = claims.findIndex(claim => claim.ids.includes(lateId));
			expect(claims[taking].dueSince).toBeNull();
			expect(claims[taking].poll % 10).toBe(0);
			// The polls before it read only newer rows.
			expect(claims.slice(0, taking).every(claim => claim.dueSince !== null)).toBe(true);
			await waitUntil(async () => (await stack.db("deliveries").where({ id: lateId }).first("parked")).parked, Boolean, "the late row to be parked");
		} finally {
			dispatcher.claimBatch = claimBatch;
		}
	});
});
