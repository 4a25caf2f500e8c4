// Fault 5 of issue 8: PostgreSQL becomes unreachable under a running cluster. Every role reaches
// the database through a TCP relay this test controls; cutting it refuses new connections and
// kills the live ones, which is what a database crash or a network partition looks like.
//
// While it is cut: the API answers 503 problem+json that names no SQL, host, port or schema;
// writes caught mid-flight either happened entirely (201) or not at all (503); /health says 503.
// Once the relay is back, the same processes (no restart) serve requests again, and events sent
// to the channel during the outage are all delivered, webhooks and emails alike.
import fs from "node:fs";
import type { Knex } from "knex";
import {
	Cluster,
	describeCluster,
	eventually,
	emailWorthy,
	orderEvents,
	printFigures,
	withClusterLogs,
	type ClusterWebhook,
	type HttpAnswer,
} from "./helpers/cluster";

const CUSTOMER = "outage-co";
/** The customer whose creates are caught by the cut (its webhooks get none of the events). */
const LANES_CUSTOMER = "lanes-co";
const OUTAGE_EVENTS = 100;
/** Tables the events taken in after the outage write to; the rest must not change at all. */
const INTAKE_TABLE = /^(deliver|email_)/;
const CREATE_LANES = 6;

/** Everything in the cluster's tables, to show that a refused write left nothing behind. */
async function tableContents(db: Knex, schema: string): Promise<Record<string, unknown[]>> {
	const tables: Array<{ table_name: string }> = await db("information_schema.tables").where({ table_schema: schema }).select("table_name");
	const contents: Record<string, unknown[]> = {};
	for (const { table_name: table } of tables.sort((a, b) => a.table_name.localeCompare(b.table_name))) {
		if (table.startsWith("knex_migrations")) continue;
		contents[table] = await db.raw(`SELECT * FROM "${schema}"."${table}" ORDER BY 1`).then(result => result.rows);
	}
	return contents;
}

function expectOpaque503(answer: HttpAnswer, cluster: Cluster, what: string): void {
	expect({ what, status: answer.status, contentType: answer.headers.get("content-type") }).toEqual({
		what,
		status: 503,
		contentType: expect.stringContaining("application/problem+json"),
	});
	expect(answer.body).toMatchObject({ type: expect.any(String), title: "Service Unavailable", status: 503, detail: expect.any(String) });
	const leaks = [
		/select |insert |update |delete from|relation|violates|syntax/i,
		/postgres|knex|\bpg\b|pool|ECONN|ETIMEDOUT|terminated|socket/i,
		/127\.0\.0\.1|localhost|::1/,
		new RegExp(String(cluster.relay!.port)),
		new RegExp(cluster.schema, "i"),
		/\bat .+\.(ts|js):\d+/,
	];
	for (const leak of leaks) expect({ what, text: answer.text, leaks: leak.test(answer.text) }).toEqual({ what, text: answer.text, leaks: false });
}

describeCluster("cluster fault 5: PostgreSQL unreachable behind a relay", () => {
	let cluster: Cluster | undefined;
	let token: string;
	let lanesToken: string;
	let webhook: ClusterWebhook;

	beforeAll(async () => {
		cluster = await Cluster.start({ label: "pgcut", databaseRelay: true });
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			await c.startRoles(["gateway", "gateway"], ["dispatcher", "dispatcher"], ["notifier", "notifier"]);
			token = await c.token("olive", { customer: CUSTOMER, email: "olive@example.com", name: "Olive" });
			await c.optInToEmail(token);
			webhook = await c.createWebhook(token, CUSTOMER);
			lanesToken = await c.token("lane", { customer: LANES_CUSTOMER });
			// Known before the snapshot: a first request writes the user's row.
			expect((await c.request("GET", "/id/v3/user/details", { token: lanesToken })).status).toBe(200);
		});
	}, 120_000);
	afterAll(() => cluster?.close(), 60_000);

	it("answers 503 without internals, writes all or nothing, and recovers without a restart", async () => {
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			const pids = [...c.roles.values()].map(role => role.pid);
			const before = await tableContents(c.db, c.schema);

			// Writes in flight when the database goes away: lanes of creates, cut once some landed.
			// A create is caught by the cut when it was sent before the cut began and answered after.
			const createAnswers: Array<HttpAnswer & { name: string; caught: boolean }> = [];
			const cutWithCreatesInFlight = async (round: number) => {
				let cutting = false;
				let cut = false;
				const lane = async (laneNumber: number) => {
					for (let index = 0; !cut; index++) {
						const name = `lane ${laneNumber} #${index}${round > 1 ? ` (cut ${round})` : ""}`;
						const body = { name, url: `${c.receiver.url}/outage/${round}/${laneNumber}/${index}`, events: ["tasking:order_status"] };
						const sentBeforeCut = !cutting;
						const answer = await c.request("POST", "/id/v3/webhooks", { token: lanesToken, body });
						createAnswers.push({ ...answer, name, caught: sentBeforeCut && cutting });
					}
				};
				const landedBefore = createAnswers.filter(answer => answer.status === 201).length;
				const lanes = Array.from({ length: CREATE_LANES }, (_, laneNumber) => lane(laneNumber));
				await eventually(() => createAnswers.filter(answer => answer.status === 201).length, count => count >= landedBefore + 10, "some creates to land");
				cutting = true;
				await c.relay!.cut();
				cut = true;
				await Promise.all(lanes);
			};
			// The cut must catch a write mid-flight and refuse it. Whether one of the lanes' creates is
			// inside the database at that instant is chance (a CI run caught six, all between their
			// COMMIT and their answer), so the database comes back and is cut again, up to three times.
			const refusedWhileCaught = () => createAnswers.filter(answer => answer.caught && answer.status === 503).length;
			let cuts = 0;
			for (let round = 1; round <= 3; round++) {
				cuts = round;
				await cutWithCreatesInFlight(round);
				if (refusedWhileCaught() > 0 || round === 3) break;
				await c.relay!.restore();
				await eventually(() => c.request("GET", "/id/v3/user/details", { token: lanesToken }), answer => answer.status === 200, "the API to answer again between cuts");
			}
			for (const [index, answer] of createAnswers.entries()) {
				if (answer.status !== 201) expectOpaque503(answer, c, `create ${index} caught by the cut`);
			}
			// The cut did catch writes mid-flight, and at least one of them was refused.
			expect(refusedWhileCaught()).toBeGreaterThanOrEqual(1);

			// Events keep coming while the database is gone: JetStream stores them, and the
			// consumers, unable to persist, ask for them again later instead of dropping them.
			const outageEvents = orderEvents(OUTAGE_EVENTS, { customer: CUSTOMER, users: ["olive"], prefix: "outage" });
			const sent = await c.send(outageEvents);

			// Every kind of request while it stays down.
			const during: Array<[string, Promise<HttpAnswer>]> = [
				["list webhooks", c.request("GET", "/id/v3/webhooks", { token })],
				["get webhook", c.request("GET", `/id/v3/webhooks/${webhook.id}`, { token })],
				["create webhook", c.request("POST", "/id/v3/webhooks", { token, body: { name: "while down", url: `${c.receiver.url}/down`, events: ["tasking:order_status"] } })],
				["rename webhook", c.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token, body: { name: "renamed while down" } })],
				["rotate secret", c.request("POST", `/id/v3/webhooks/${webhook.id}/rotate`, { token })],
				["delete webhook", c.request("DELETE", `/id/v3/webhooks/${webhook.id}`, { token })],
				["delivery log", c.request("GET", `/id/v3/webhooks/${webhook.id}/deliveries`, { token })],
				["user details", c.request("GET", "/id/v3/user/details", { token })],
				[
					"email off",
					c.request("PUT", "/id/v3/user/settings", {
						token,
						body: { notifications: [{ category: "tasking", settings: [{ topic: "tasking:order_status", email: false }] }] },
					}),
				],
			];
			for (const [what, answer] of during) expectOpaque503(await answer, c, what);

			for (const role of c.roles.values()) {
				const health = await role.health();
				expect({ role: role.name, status: health?.status, database: health?.body?.checks?.database?.ok }).toEqual({ role: role.name, status: 503, database: false });
			}

			expect(c.deliveredCount([webhook])).toBe(0);
			await c.relay!.restore();
			await eventually(() => c.request("GET", "/id/v3/webhooks?per_page=100", { token: lanesToken }), answer => answer.status === 200, "the API to answer again");
			for (const role of c.roles.values()) await eventually(() => role.health(), health => health?.status === 200, `${role.name} to be healthy again`);
			// The same processes recovered: nothing was restarted.
			expect([...c.roles.values()].map(role => role.pid)).toEqual(pids);
			expect([...c.roles.values()].every(role => role.running && role.starts === 1)).toBe(true);

			// A create answered 201 exists. One answered 503 exists only if the database went away
			// between its COMMIT and the answer, and then the 503 must not claim nothing changed.
			// Either way no row is half-written, and no other table changed.
			const after = await tableContents(c.db, c.schema);
			const afterWebhooks = after.webhooks as Array<Record<string, unknown>>;
			const stored = new Map(afterWebhooks.map(row => [row.name as string, row]));
			let committedDespite503 = 0;
			for (const answer of createAnswers) {
				if (answer.status === 201) {
					expect(stored.get(answer.name)?.id).toBe(answer.body.id);
				} else if (stored.has(answer.name)) {
					committedDespite503 += 1;
					expect({ name: answer.name, detail: answer.body.detail }).toEqual({ name: answer.name, detail: expect.stringContaining("may or may not have been applied") });
				}
			}
			const requested = new Set([webhook.id, ...createAnswers.map(answer => answer.name)]);
			expect(afterWebhooks.filter(row => !requested.has(row.name as string) && row.id !== webhook.id)).toEqual([]);
			for (const row of afterWebhooks) {
				expect(row).toMatchObject({ customer_id: expect.stringMatching(new RegExp(`^(${CUSTOMER}|${LANES_CUSTOMER})$`)), url: expect.stringMatching(/^https:/), secret_envelope: expect.any(String), events: '["tasking:order_status"]' });
			}
			expect(after.webhooks).toEqual(expect.arrayContaining(before.webhooks));
			for (const table of Object.keys(before).filter(name => name !== "webhooks" && !INTAKE_TABLE.test(name))) {
				expect({ table, rows: after[table] }).toEqual({ table, rows: before[table] });
			}
			const listed = await c.request("GET", "/id/v3/webhooks?per_page=100", { token: lanesToken });
			expect(listed.body.webhooks.map((row: { name: string }) => row.name).sort()).toEqual(afterWebhooks.filter(row => row.customer_id === LANES_CUSTOMER).map(row => row.name as string).sort());
			const created = createAnswers.filter(answer => answer.status === 201);

			// And writes work again, through the same gateway.
			const again = await c.request("POST", "/id/v3/webhooks", { token: lanesToken, body: { name: "after outage", url: `${c.receiver.url}/after`, events: ["tasking:order_status"] } });
			expect(again.status).toBe(201);

			// The events sent during the outage all arrive, through the same processes.
			await c.waitForDeliveries([webhook], outageEvents, 120_000);
			const expectedEmails = emailWorthy(outageEvents, "olive");
			await c.waitForEmails(expectedEmails, outageEvents, 120_000);
			const deliveries = c.deliveryFigures([webhook], outageEvents, sent);
			const emails = c.emailFigures(expectedEmails, outageEvents);
			// Both consumers did try while the database was gone, and asked JetStream to wait.
			for (const name of ["dispatcher", "notifier"]) {
				expect({ name, askedForRedelivery: fs.readFileSync(c.role(name).logFile, "utf8").includes("JetStream redelivers it") }).toEqual({ name, askedForRedelivery: true });
			}
			// Waiting for the database is not a reason to reject (or dead-letter) an event.
			expect(await c.db("delivery_rejected_events").count({ count: "*" }).then(([row]) => Number(row.count))).toBe(0);
			expect(await c.db("email_rejected_events").count({ count: "*" }).then(([row]) => Number(row.count))).toBe(0);
			expect(deliveries).toMatchObject({ sent: OUTAGE_EVENTS, lost: 0, bad_signatures: 0, wrong_payloads: 0, unexpected: 0, split_deliveries: 0 });
			expect(emails).toMatchObject({ expected: expectedEmails.length, lost: 0, unexpected: 0 });

			printFigures("fault 5: PostgreSQL cut", {
				creates: createAnswers.length,
				created: created.length,
				answered_503: createAnswers.length - created.length,
				cuts,
				caught_mid_flight: createAnswers.filter(answer => answer.caught).length,
				caught_mid_flight_503: refusedWhileCaught(),
				committed_despite_503: committedDespite503,
				half_written: 0,
				events_sent_during_outage: deliveries,
				emails,
				restarts: 0,
			});
		});
	}, 180_000);
});
