// lib/young-table-statistics.ts: the dispatcher analyzes its PostgreSQL tables itself while they
// grow from empty, once past each step of rows written, one run at a time; and on a real
// PostgreSQL, a dispatcher that has written a thousand deliveries has had them analyzed, so that
// the order queues' promotion reads the queues' own index entries instead of every waiting row.
import { YoungTableStatistics } from "../lib/young-table-statistics";
import { newCustomer, orderEvent, startDeliveryStack, waitUntil, type DeliveryStack } from "./helpers/delivery-stack";
import { describeWhere } from "./helpers/services";

describe("YoungTableStatistics", () => {
	it("analyzes once past each step, with the rows written so far, and never twice at once", async () => {
		const runs: number[] = [];
		let finish: () => void = () => undefined;
		const statistics = new YoungTableStatistics(
			rows => {
				runs.push(rows);
				return new Promise<void>(resolve => (finish = resolve));
			},
			[10, 100],
		);
		statistics.noteWritten(9);
		expect(runs).toEqual([]);
		statistics.noteWritten(5);
		expect(runs).toEqual([14]);
		// Past the next step while the first run goes on: left for the next rows after it.
		statistics.noteWritten(90);
		expect(runs).toEqual([14]);
		finish();
		await statistics.settled();
		statistics.noteWritten(1);
		expect(runs).toEqual([14, 105]);
		finish();
		await statistics.settled();
		// Past the last step: never again.
		statistics.noteWritten(10_000);
		expect(runs).toEqual([14, 105]);
	});

	it("takes a step skipped by one large batch as passed", () => {
		const runs: number[] = [];
		const statistics = new YoungTableStatistics(async rows => void runs.push(rows), [10, 100, 1_000]);
		statistics.noteWritten(500);
		expect(runs).toEqual([500]);
	});
});

describeWhere({ postgres: true })("a dispatcher on PostgreSQL with young tables", () => {
	let env: DeliveryStack;
	beforeAll(async () => (env = await startDeliveryStack("postgres")));
	afterAll(() => env?.stop());

	it("analyzes the delivery tables once it has written a thousand deliveries", async () => {
		const analyzeCount = async () =>
			Number((await env.stack.db.raw("SELECT coalesce(max(analyze_count), 0) AS n FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname = 'deliveries'")).rows[0].n);
		expect(await analyzeCount()).toBe(0);
		const customer = await newCustomer(env.stack);
		for (let i = 0; i < 5; i++) await env.createWebhook(customer.token);
		for (let i = 0; i < 199; i++) await env.stack.app.broker.call("dispatcher.publish", orderEvent(customer));
		// 995 deliveries written: not yet.
		expect(await analyzeCount()).toBe(0);
		await env.stack.app.broker.call("dispatcher.publish", orderEvent(customer));
		await waitUntil(analyzeCount, count => count === 1, "the deliveries table to be analyzed");
		const [{ reltuples }] = (await env.stack.db.raw("SELECT reltuples FROM pg_class WHERE oid = to_regclass('deliveries')")).rows;
		expect(Number(reltuples)).toBeGreaterThanOrEqual(1_000);
	});
});
