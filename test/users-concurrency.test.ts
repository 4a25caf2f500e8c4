// The users service under parallel requests: concurrent updates of different topics all
// survive, concurrent If-Match updates let exactly one through, and refreshing the user record
// from unchanged claims writes nothing. SQLite and PostgreSQL.
import type { Knex } from "knex";
import { expectProblem, snapshotTables, startStack, type Stack } from "./helpers/stack";
import { testDatabases } from "./helpers/services";

const DETAILS = "/id/v3/user/details";
const SETTINGS = "/id/v3/user/settings";
const TOPIC_COUNT = 12;
const LOAD_TOPICS = Array.from({ length: TOPIC_COUNT }, (_, i) => `load:topic_${String(i + 1).padStart(2, "0")}`);

function emailStates(body: any): Record<string, boolean> {
	const states: Record<string, boolean> = {};
	for (const group of body.user_metadata.notifications) for (const setting of group.settings) states[setting.topic] = setting.email;
	return states;
}

const loadSetting = (topic: string, email: boolean) => ({ notifications: [{ category: "load", settings: [{ topic, email }] }] });

describe.each(testDatabases())("users concurrency on %s", database => {
	let stack: Stack;

	const get = (token: string) => stack.request("GET", DETAILS, { token });
	const put = (token: string, body: unknown, headers?: Record<string, string>) => stack.request("PUT", SETTINGS, { token, body, headers });

	beforeAll(async () => {
		stack = await startStack({ services: ["api", "topics", "users"], database });
		for (const topic of LOAD_TOPICS) {
			await stack.app.broker.call("topics.register", { topic, category: "load", name: `Load ${topic}`, description: "Concurrency test topic", email: true });
		}
	});
	afterAll(() => stack?.stop());

	it(`keeps all ${TOPIC_COUNT} parallel updates of different topics, even for a user's very first requests`, async () => {
		const token = await stack.token("ursula", { name: "Ursula" });
		// No request before: the parallel ones also race to create the user record.
		const enabled = await Promise.all(LOAD_TOPICS.map(topic => put(token, loadSetting(topic, true))));
		expect(enabled.map(response => response.status)).toEqual(LOAD_TOPICS.map(() => 200));
		for (const [i, response] of enabled.entries()) expect(emailStates(response.body)[LOAD_TOPICS[i]]).toBe(true);

		const afterEnable = emailStates((await get(token)).body);
		expect(LOAD_TOPICS.filter(topic => afterEnable[topic])).toEqual(LOAD_TOPICS);
		expect(await stack.db("users").where({ user_id: "ursula" })).toHaveLength(1);

		// Second round, mixed: half are turned off over HTTP while the other half and the seeded topic
		// are written through the internal action the one-click unsubscribe uses.
		const turnOff = LOAD_TOPICS.filter((_, i) => i % 2 === 0);
		const keepOn = LOAD_TOPICS.filter((_, i) => i % 2 === 1);
		await Promise.all([
			...turnOff.map(topic => put(token, loadSetting(topic, false)).then(response => expect(response.status).toBe(200))),
			...keepOn.map(topic => stack.app.broker.call("users.setEmailPreference", { userId: "ursula", topic, email: true })),
			stack.app.broker.call("users.setEmailPreference", { userId: "ursula", topic: "tasking:order_status", email: true }),
		]);
		const final = emailStates((await get(token)).body);
		expect(final).toEqual({
			"tasking:order_status": true,
			...Object.fromEntries(turnOff.map(topic => [topic, false])),
			...Object.fromEntries(keepOn.map(topic => [topic, true])),
		});
	});

	it("lets exactly one of several parallel updates with the same If-Match through; the others get 412 and change nothing", async () => {
		const token = await stack.token("victor");
		const tag = (await get(token)).headers.get("etag")!;
		const responses = await Promise.all(LOAD_TOPICS.map(topic => put(token, loadSetting(topic, true), { "if-match": tag })));

		const winners = responses.filter(response => response.status === 200);
		expect(winners).toHaveLength(1);
		for (const response of responses.filter(candidate => candidate.status !== 200)) expectProblem(response, 412);

		const winningTopic = LOAD_TOPICS.find(topic => emailStates(winners[0].body)[topic])!;
		const stored = await stack.db("user_email_preferences").where({ user_id: "victor" }).select("topic", "email");
		expect(stored.map(row => ({ topic: row.topic, email: Boolean(row.email) }))).toEqual([{ topic: winningTopic, email: true }]);
	});

	describe("refreshing the user record", () => {
		let writes: string[];
		const recordWrites = (query: { sql: string }) => {
			if (/^\s*(insert|update|delete)\b/i.test(query.sql)) writes.push(query.sql);
		};
		const servicesDb = () => (stack.app.broker.getLocalService("users") as unknown as { db: Knex }).db;

		beforeEach(() => {
			writes = [];
			servicesDb().on("query", recordWrites);
		});
		afterEach(() => {
			servicesDb().removeListener("query", recordWrites);
		});

		it("writes nothing when the claims are unchanged, and once when they change", async () => {
			const token = await stack.token("wanda", { name: "Wanda", email: "wanda@example.com" });
			await get(token);
			expect(writes.filter(sql => /users/.test(sql))).toHaveLength(1);
			const [before] = await stack.db("users").where({ user_id: "wanda" });

			writes = [];
			for (let i = 0; i < 5; i++) expect((await get(token)).status).toBe(200);
			expect(writes).toEqual([]);

			// Past the gateway's cache and the service's own: the service still compares before writing.
			const users = stack.app.broker.getLocalService("users") as unknown as { touchedFingerprints: Map<string, string> };
			const principal = { userId: "wanda", customerId: "~wanda", name: "Wanda", email: "wanda@example.com", lastLogin: before.last_login };
			for (let i = 0; i < 3; i++) {
				users.touchedFingerprints.clear();
				expect(await stack.app.broker.call("users.touch", principal)).toEqual({ changed: false });
			}
			expect(writes).toEqual([]);
			expect(await stack.db("users").where({ user_id: "wanda" })).toEqual([before]);

			// Re-sending a preference at its current value writes nothing either.
			await put(token, loadSetting(LOAD_TOPICS[0], true));
			writes = [];
			await put(token, loadSetting(LOAD_TOPICS[0], true));
			await put(token, loadSetting(LOAD_TOPICS[1], false));
			expect(writes).toEqual([]);

			// A changed claim is written, once.
			expect(await stack.app.broker.call("users.touch", { ...principal, name: "Wanda Maximoff" })).toEqual({ changed: true });
			expect(await stack.app.broker.call("users.touch", { ...principal, name: "Wanda Maximoff" })).toEqual({ changed: false });
			expect(writes).toHaveLength(1);
			expect(writes[0]).toMatch(/^update\b/i);
			const [after] = await stack.db("users").where({ user_id: "wanda" });
			expect(after).toMatchObject({ name: "Wanda Maximoff", created_at: before.created_at });
		});

		it("changes nothing on a rejected update", async () => {
			const token = await stack.token("xena");
			await get(token);
			const before = await snapshotTables(stack.db, ["users", "user_email_preferences"]);
			writes = [];
			expectProblem(await put(token, loadSetting("load:topic_99", true)), 422);
			expectProblem(await put(token, loadSetting(LOAD_TOPICS[0], true), { "if-match": '"stale"' }), 412);
			expect(writes).toEqual([]);
			expect(await snapshotTables(stack.db, ["users", "user_email_preferences"])).toEqual(before);
		});
	});
});
