// Migration 014 keeps a delivery's first attempt in the delivery's own row. Rows written before it
// keep theirs in delivery_attempts; delivery_attempt_log lists both. Migrating down moves the
// kept first attempts back into delivery_attempts, so no attempt is lost either way.
import crypto from "node:crypto";
import type { Knex } from "knex";
import { runMigrations } from "../mixins/db.mixin";
import { dispatcherMigrations } from "../migrations/dispatcher";
import { testDatabases } from "./helpers/services";
import { scratchDatabase, type ScratchDatabase } from "./helpers/scratch-database";

const BEFORE_014 = dispatcherMigrations.filter(migration => migration.name < "014");
const FIRST_ATTEMPT_IN_ROW = dispatcherMigrations.find(migration => migration.name === "014_first_attempt_in_delivery")!;

describe.each(testDatabases())("a delivery's first attempt in its own row (migration 014), on %s", database => {
	let scratch: ScratchDatabase;
	let db: Knex;

	beforeAll(async () => {
		scratch = await scratchDatabase(database, "first-attempt");
		db = scratch.db;
	});
	afterAll(() => scratch?.drop());

	const at = (second: number) => `2026-11-27T12:00:${String(second).padStart(2, "0")}.000Z`;
	const attempt = (deliveryId: string, number: number, success: boolean, statusCode: number) => ({
		delivery_id: deliveryId,
		attempt: number,
		attempted_at: at(number),
		success,
		status_code: statusCode,
		error_kind: success ? null : "http_status",
		title: success ? null : "HTTP Status Error",
		detail: success ? "" : `The URL answered HTTP ${statusCode}`,
		duration_ms: 10 + number,
		response_excerpt: `answer ${number}`,
	});
	const log = async () =>
		(await db("delivery_attempt_log").orderBy(["delivery_id", "attempt"])).map((row: Record<string, unknown>) => ({
			...row,
			success: Boolean(row.success),
			attempt: Number(row.attempt),
		}));

	it("lists old and new attempts as one log, and moves kept first attempts back when migrating down", async () => {
		await runMigrations(db, "dispatcher", BEFORE_014);
		const eventId = crypto.randomUUID();
		await db("delivery_messages").insert({ event_id: eventId, customer_id: "alice", user_id: "alice", type: "tasking:order_status", body: "{}", occurred_at: at(0), created_at: at(0) });
		const [before, after] = ["a", "b"].map(prefix => `${prefix}${crypto.randomUUID().slice(1)}`);
		const delivery = (id: string, attemptCount: number) => ({ id, event_id: eventId, webhook_id: crypto.randomUUID(), customer_id: "alice", status: "succeeded", attempt_count: attemptCount, first_attempt_at: at(1), created_at: at(0), updated_at: at(2) });
		// Written before 014: its only attempt is a row of delivery_attempts.
		await db("deliveries").insert(delivery(before, 1));
		await db("delivery_attempts").insert(attempt(before, 1, true, 200));

		await runMigrations(db, "dispatcher", dispatcherMigrations);
		// Written after: the first attempt (a 500) in the delivery's row, the second in delivery_attempts.
		const first = attempt(after, 1, false, 500);
		await db("deliveries").insert({
			...delivery(after, 2),
			first_attempt_success: first.success,
			first_attempt_status_code: first.status_code,
			first_attempt_error_kind: first.error_kind,
			first_attempt_title: first.title,
			first_attempt_detail: first.detail,
			first_attempt_duration_ms: first.duration_ms,
			first_attempt_response_excerpt: first.response_excerpt,
		});
		await db("delivery_attempts").insert(attempt(after, 2, true, 200));
		const expected = [attempt(before, 1, true, 200), first, attempt(after, 2, true, 200)];
		expect(await log()).toEqual(expected);

		await FIRST_ATTEMPT_IN_ROW.down(db);
		const moved = await db("delivery_attempts").orderBy(["delivery_id", "attempt"]).select(Object.keys(first));
		expect(moved.map(row => ({ ...row, success: Boolean(row.success) }))).toEqual(expected);
		expect(await db.schema.hasColumn("deliveries", "first_attempt_success")).toBe(false);

		await FIRST_ATTEMPT_IN_ROW.up(db);
		expect(await log()).toEqual(expected);
		expect(await db("deliveries").whereNotNull("first_attempt_success").count({ count: "*" })).toEqual([{ count: database === "postgres" ? "0" : 0 }]);
	});
});
