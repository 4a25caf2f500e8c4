// The users service through the real gateway: GET /user/details, PUT /user/settings (merge,
// validation, ETag/If-Match), user records from token claims, isolation between users, bad
// input that changes nothing, and the internal actions the notifier uses. SQLite and PostgreSQL.
import { SignJWT, type JWTPayload } from "jose";
import { expectProblem, snapshotTables, startStack, type Stack } from "./helpers/stack";
import { testDatabases } from "./helpers/services";

const DETAILS = "/id/v3/user/details";
const SETTINGS = "/id/v3/user/settings";
const USER_TABLES = ["users", "user_email_preferences"];

const ORDER_STATUS = "tasking:order_status";
const ORDER_DELIVERY = "tasking:order_delivery";
const ARCHIVE_READY = "imagery:archive_ready";
// Webhooks only: never listed in user settings, never accepted there.
const DEBUG_TRACE = "tasking:debug_trace";

interface Setting {
	topic: string;
	email: boolean;
}

/** topic -> email, flattened from a details body. */
function emailStates(body: any): Record<string, boolean> {
	const states: Record<string, boolean> = {};
	for (const group of body.user_metadata.notifications) for (const setting of group.settings) states[setting.topic] = setting.email;
	return states;
}

function tasking(...settings: Setting[]) {
	return { category: "tasking", settings };
}

describe.each(testDatabases())("users on %s", database => {
	let stack: Stack;

	const get = (token?: string, path = DETAILS, headers?: Record<string, string>) => stack.request("GET", path, { token, headers });
	const put = (token: string | undefined, body: unknown, headers?: Record<string, string>, path = SETTINGS) =>
		stack.request("PUT", path, { token, body, headers });
	const snapshot = () => snapshotTables(stack.db, USER_TABLES);
	const secret = () => new TextEncoder().encode(stack.config.AUTH_JWT_SECRET);
	const signToken = (claims: JWTPayload & { sub: string }) =>
		new SignJWT(claims).setProtectedHeader({ alg: "HS256" }).setExpirationTime("1h").sign(secret());

	beforeAll(async () => {
		stack = await startStack({ services: ["api", "topics", "users"], database });
		const register = (topic: string, name: string, email: boolean) =>
			stack.app.broker.call("topics.register", { topic, category: topic.split(":")[0], name, description: `${name} (test)`, email });
		await register(ORDER_DELIVERY, "Tasking order delivery", true);
		await register(ARCHIVE_READY, "Archive imagery ready", true);
		await register(DEBUG_TRACE, "Debug trace", false);
	});
	afterAll(() => stack?.stop());

	describe("GET /user/details", () => {
		it("lists every email-capable topic grouped by category, all off by default, with a strong ETag", async () => {
			const token = await stack.token("dora", { name: "Dora", email: "dora@example.com" });
			const response = await get(token);
			expect(response.status).toBe(200);
			expect(response.body).toEqual({
				user_id: "dora",
				name: "Dora",
				email: "dora@example.com",
				user_metadata: {
					notifications: [
						{
							category: "imagery",
							settings: [{ topic: ARCHIVE_READY, name: "Archive imagery ready", description: "Archive imagery ready (test)", email: false }],
						},
						{
							category: "tasking",
							settings: [
								{ topic: ORDER_DELIVERY, name: "Tasking order delivery", description: "Tasking order delivery (test)", email: false },
								{ topic: ORDER_STATUS, name: "Tasking order status updates", description: "Notifications for all tasking order updates", email: false },
							],
						},
					],
				},
				last_login: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/),
			});
			expect(response.headers.get("etag")).toMatch(/^"[A-Za-z0-9_-]+"$/);
			// Nothing is stored for the defaults: absence of a row means off.
			expect(await stack.db("user_email_preferences").where({ user_id: "dora" })).toEqual([]);
		});

		it("works with a trailing slash and gives the same ETag for the same state", async () => {
			const token = await stack.token("trailing", { name: "Trail" });
			const plain = await get(token);
			const slashed = await get(token, `${DETAILS}/`);
			expect(slashed.status).toBe(200);
			expect(slashed.body).toEqual(plain.body);
			expect(slashed.headers.get("etag")).toBe(plain.headers.get("etag"));

			const updated = await put(token, { notifications: [tasking({ topic: ORDER_STATUS, email: true })] }, undefined, `${SETTINGS}/`);
			expect(updated.status).toBe(200);
			expect(emailStates(updated.body)[ORDER_STATUS]).toBe(true);
		});

		it("answers 401 without a token, on both endpoints, and stores nothing", async () => {
			const before = await snapshot();
			for (const response of [await get(undefined), await put(undefined, { notifications: [tasking({ topic: ORDER_STATUS, email: true })] })]) {
				expectProblem(response, 401);
				expect(response.headers.get("www-authenticate")).toMatch(/^Bearer/);
			}
			expect(await snapshot()).toEqual(before);
		});
	});

	describe("PUT /user/settings", () => {
		it("enables a topic and answers with the same body and ETag as GET", async () => {
			const token = await stack.token("erin", { name: "Erin", email: "erin@example.com" });
			const response = await put(token, { notifications: [tasking({ topic: ORDER_STATUS, email: true })] });
			expect(response.status).toBe(200);
			expect(emailStates(response.body)).toEqual({ [ARCHIVE_READY]: false, [ORDER_DELIVERY]: false, [ORDER_STATUS]: true });

			const details = await get(token);
			expect(details.body).toEqual(response.body);
			expect(details.headers.get("etag")).toBe(response.headers.get("etag"));
			const rows = await stack.db("user_email_preferences").where({ user_id: "erin" }).select("topic", "email");
			expect(rows.map(row => ({ topic: row.topic, email: Boolean(row.email) }))).toEqual([{ topic: ORDER_STATUS, email: true }]);
		});

		it("disables a topic again", async () => {
			const token = await stack.token("fred");
			await put(token, { notifications: [tasking({ topic: ORDER_STATUS, email: true })] });
			const response = await put(token, { notifications: [tasking({ topic: ORDER_STATUS, email: false })] });
			expect(response.status).toBe(200);
			expect(emailStates(response.body)[ORDER_STATUS]).toBe(false);
			expect(emailStates((await get(token)).body)[ORDER_STATUS]).toBe(false);
		});

		it("merges: only the topics sent change, in any category", async () => {
			const token = await stack.token("gina");
			await put(token, {
				notifications: [
					tasking({ topic: ORDER_STATUS, email: true }, { topic: ORDER_DELIVERY, email: true }),
					{ category: "imagery", settings: [{ topic: ARCHIVE_READY, email: true }] },
				],
			});
			const response = await put(token, { notifications: [tasking({ topic: ORDER_DELIVERY, email: false })] });
			expect(emailStates(response.body)).toEqual({ [ARCHIVE_READY]: true, [ORDER_DELIVERY]: false, [ORDER_STATUS]: true });

			// A category entry may also be sent twice; what matters is each topic once.
			const again = await put(token, {
				notifications: [tasking({ topic: ORDER_STATUS, email: false }), tasking({ topic: ORDER_DELIVERY, email: true })],
			});
			expect(emailStates(again.body)).toEqual({ [ARCHIVE_READY]: true, [ORDER_DELIVERY]: true, [ORDER_STATUS]: false });
		});

		it("changes nothing for an empty list, a null list or no list", async () => {
			const token = await stack.token("hank");
			const first = await put(token, { notifications: [tasking({ topic: ORDER_STATUS, email: true })] });
			const before = await snapshot();
			for (const body of [{ notifications: [] }, { notifications: null }, {}]) {
				const response = await put(token, body, { "content-type": "application/json" });
				expect(response.status).toBe(200);
				expect(response.body).toEqual(first.body);
				expect(response.headers.get("etag")).toBe(first.headers.get("etag"));
			}
			// A category with an empty settings list, and a setting repeated at its current value, write nothing either.
			expect((await put(token, { notifications: [tasking()] })).status).toBe(200);
			expect((await put(token, { notifications: [tasking({ topic: ORDER_STATUS, email: true }, { topic: ORDER_DELIVERY, email: false })] })).status).toBe(200);
			expect(await snapshot()).toEqual(before);
		});

		it("answers 422 naming every problem with its path, and changes nothing", async () => {
			const token = await stack.token("ivan");
			await put(token, { notifications: [tasking({ topic: ORDER_STATUS, email: true })] });
			const before = await snapshot();
			const response = await put(token, {
				notifications: [
					{ category: "weather", settings: [{ topic: ARCHIVE_READY, email: false }] },
					tasking(
						{ topic: "tasking:no_such_topic", email: true },
						{ topic: ARCHIVE_READY, email: true },
						{ topic: ORDER_DELIVERY, email: "yes" as unknown as boolean },
						{ topic: DEBUG_TRACE, email: true },
						{ topic: ORDER_STATUS, email: false },
					),
				],
			});
			expectProblem(response, 422);
			expect(response.body.errors).toEqual([
				{ path: "notifications[0].category", message: expect.stringContaining('Unknown category "weather"') },
				{ path: "notifications[1].settings[0].topic", message: expect.stringContaining('Unknown topic "tasking:no_such_topic"') },
				{ path: "notifications[1].settings[1].topic", message: 'Topic "imagery:archive_ready" belongs to category "imagery", not "tasking"' },
				{ path: "notifications[1].settings[2].email", message: "must be true or false" },
				{ path: "notifications[1].settings[3].topic", message: expect.stringContaining('Unknown topic "tasking:debug_trace"') },
			]);
			// The valid entry in the same body was not applied either.
			expect(await snapshot()).toEqual(before);
			expect(emailStates((await get(token)).body)[ORDER_STATUS]).toBe(true);
		});

		it.each([
			["an unknown top-level field", { notifications: [], sms: true }, "sms"],
			["an attempt to name another user", { user_id: "bob", notifications: [] }, "user_id"],
			["an unknown field in a category entry", { notifications: [{ ...tasking(), push: true }] }, "notifications[0].push"],
			["an unknown field in a setting", { notifications: [tasking({ topic: ORDER_STATUS, email: true, sms: true } as Setting)] }, "notifications[0].settings[0].sms"],
			["a list that is a string", { notifications: "tasking" }, "notifications"],
			["a list that is an object", { notifications: { category: "tasking" } }, "notifications"],
			["a category entry that is a string", { notifications: ["tasking"] }, "notifications[0]"],
			["a category that is a number", { notifications: [{ category: 7, settings: [] }] }, "notifications[0].category"],
			["missing settings", { notifications: [{ category: "tasking" }] }, "notifications[0].settings"],
			["settings that are an object", { notifications: [{ category: "tasking", settings: { topic: ORDER_STATUS } }] }, "notifications[0].settings"],
			["a topic that is a number", { notifications: [tasking({ topic: 5, email: true } as unknown as Setting)] }, "notifications[0].settings[0].topic"],
			["a missing email", { notifications: [tasking({ topic: ORDER_STATUS } as Setting)] }, "notifications[0].settings[0].email"],
			["an email of 1", { notifications: [tasking({ topic: ORDER_STATUS, email: 1 } as unknown as Setting)] }, "notifications[0].settings[0].email"],
			["an email of null", { notifications: [tasking({ topic: ORDER_STATUS, email: null } as unknown as Setting)] }, "notifications[0].settings[0].email"],
			["an email of \"true\"", { notifications: [tasking({ topic: ORDER_STATUS, email: "true" } as unknown as Setting)] }, "notifications[0].settings[0].email"],
			["a topic listed twice", { notifications: [tasking({ topic: ORDER_STATUS, email: true }, { topic: ORDER_STATUS, email: false })] }, "notifications[0].settings[1].topic"],
			["an oversized topic", { notifications: [tasking({ topic: `tasking:${"x".repeat(200)}`, email: true })] }, "notifications[0].settings[0].topic"],
		])("answers 422 for %s, at path %j, and changes nothing", async (_label, body, path) => {
			const token = await stack.token("judy");
			await get(token);
			const before = await snapshot();
			const response = await put(token, body);
			expectProblem(response, 422);
			expect(response.body.errors).toContainEqual({ path, message: expect.any(String) });
			expect(await snapshot()).toEqual(before);
		});

		it("rejects bodies that are not JSON objects with 400, 413, 415 and 422, and changes nothing", async () => {
			const token = await stack.token("kate");
			await get(token);
			const before = await snapshot();
			const enable = JSON.stringify({ notifications: [tasking({ topic: ORDER_STATUS, email: true })] });
			const json = { "content-type": "application/json" };

			expectProblem(await put(token, '{"notifications": [', json), 400);
			expectProblem(await put(token, "{'notifications': []}", json), 400);
			const huge = JSON.stringify({ notifications: [tasking({ topic: ORDER_STATUS, email: true })], padding: "x".repeat(1024 * 1024) });
			expectProblem(await put(token, huge, json), 413);
			expectProblem(await put(token, enable, { "content-type": "text/plain" }), 415);
			expectProblem(await put(token, enable, { "content-type": "application/x-www-form-urlencoded" }), 415);
			expectProblem(await put(token, "[]", json), 422);
			// A bare scalar is refused; whether as malformed (400) or as not an object (422) is the gateway's choice.
			for (const scalar of ['"notifications"', "42", "true"]) {
				const response = await put(token, scalar, json);
				expect([400, 422]).toContain(response.status);
				expectProblem(response, response.status);
			}

			expect(await snapshot()).toEqual(before);
		});
	});

	describe("ETag and If-Match", () => {
		it("changes the ETag with the state and honours If-Match: stale 412 changes nothing, current 200", async () => {
			const token = await stack.token("lena");
			const initial = await get(token);
			const initialTag = initial.headers.get("etag")!;

			const changed = await put(token, { notifications: [tasking({ topic: ORDER_STATUS, email: true })] }, { "if-match": initialTag });
			expect(changed.status).toBe(200);
			const currentTag = changed.headers.get("etag")!;
			expect(currentTag).not.toBe(initialTag);

			const before = await snapshot();
			const stale = await put(token, { notifications: [tasking({ topic: ORDER_DELIVERY, email: true })] }, { "if-match": initialTag });
			expectProblem(stale, 412);
			expect(stale.headers.get("etag")).toBeNull();
			expect(await snapshot()).toEqual(before);
			expect((await get(token)).headers.get("etag")).toBe(currentTag);

			// A weak tag never matches (If-Match compares strongly), nor does an unquoted one.
			for (const header of [`W/${currentTag}`, currentTag.slice(1, -1), ""]) {
				expectProblem(await put(token, { notifications: [] }, { "if-match": header }), 412);
			}
			expect(await snapshot()).toEqual(before);

			const current = await put(token, { notifications: [tasking({ topic: ORDER_DELIVERY, email: true })] }, { "if-match": `"other", ${currentTag}` });
			expect(current.status).toBe(200);
			expect(emailStates(current.body)).toMatchObject({ [ORDER_STATUS]: true, [ORDER_DELIVERY]: true });
		});

		it("treats If-Match: * as 'whatever the current state is'", async () => {
			const token = await stack.token("mona");
			const response = await put(token, { notifications: [tasking({ topic: ORDER_STATUS, email: true })] }, { "if-match": "*" });
			expect(response.status).toBe(200);
			expect(emailStates(response.body)[ORDER_STATUS]).toBe(true);
		});

		it("checks the body before the precondition: invalid input is 422 even with a stale tag", async () => {
			const token = await stack.token("nora");
			const response = await put(token, { notifications: [tasking({ topic: "tasking:nope", email: true })] }, { "if-match": '"stale"' });
			expectProblem(response, 422);
		});
	});

	describe("isolation between users", () => {
		it("lets each token read and change only its own record", async () => {
			const alice = await stack.token("alice", { name: "Alice", email: "alice@example.com" });
			const bob = await stack.token("bob", { name: "Bob", email: "bob@example.com" });

			await put(alice, { notifications: [tasking({ topic: ORDER_STATUS, email: true })] });
			const bobView = await get(bob);
			expect(bobView.body).toMatchObject({ user_id: "bob", name: "Bob", email: "bob@example.com" });
			expect(Object.values(emailStates(bobView.body))).toEqual([false, false, false]);

			const bobChange = await put(bob, { notifications: [{ category: "imagery", settings: [{ topic: ARCHIVE_READY, email: true }] }] });
			expect(bobChange.body.user_id).toBe("bob");
			const aliceView = await get(alice);
			expect(aliceView.body).toMatchObject({ user_id: "alice", name: "Alice", email: "alice@example.com" });
			expect(emailStates(aliceView.body)).toEqual({ [ARCHIVE_READY]: false, [ORDER_DELIVERY]: false, [ORDER_STATUS]: true });

			// There is no way to name another user: query parameters and body fields are refused.
			const before = await snapshot();
			expectProblem(await get(alice, `${DETAILS}?user_id=bob`), 422);
			expectProblem(await put(alice, { user_id: "bob", notifications: [tasking({ topic: ORDER_DELIVERY, email: true })] }), 422);
			expectProblem(await put(alice, { notifications: [tasking({ topic: ORDER_DELIVERY, email: true })] }, undefined, `${SETTINGS}?user_id=bob`), 422);
			expect(await snapshot()).toEqual(before);
			// Bob's ETag is useless to Alice.
			expectProblem(await put(alice, { notifications: [] }, { "if-match": bobChange.headers.get("etag")! }), 412);
			expect(emailStates((await get(bob)).body)).toEqual({ [ARCHIVE_READY]: true, [ORDER_DELIVERY]: false, [ORDER_STATUS]: false });
		});
	});

	describe("user record from token claims", () => {
		it("refreshes name, email and last_login from newer tokens; auth_time beats iat; older tokens do not roll it back", async () => {
			const now = Math.floor(Date.now() / 1000);
			const iso = (seconds: number) => new Date(seconds * 1000).toISOString();

			const first = await signToken({ sub: "olga", name: "Olga", email: "olga@old.example", iat: now - 7200 });
			expect((await get(first)).body).toMatchObject({ user_id: "olga", name: "Olga", email: "olga@old.example", last_login: iso(now - 7200) });

			const second = await signToken({ sub: "olga", name: "Olga Petrova", email: "olga@new.example", iat: now, auth_time: now - 3600 });
			expect((await get(second)).body).toMatchObject({ name: "Olga Petrova", email: "olga@new.example", last_login: iso(now - 3600) });

			// The first token is still valid, but it describes an older login: the record keeps the newer claims.
			expect((await get(first)).body).toMatchObject({ name: "Olga Petrova", email: "olga@new.example", last_login: iso(now - 3600) });

			// A token without name and email claims keeps the stored ones.
			const bare = await signToken({ sub: "olga", iat: now - 60 });
			expect((await get(bare)).body).toMatchObject({ name: "Olga Petrova", email: "olga@new.example", last_login: iso(now - 60) });

			const customer = await signToken({ sub: "olga", customer_id: "acme", iat: now });
			await get(customer);
			expect(await stack.app.broker.call("users.get", { userId: "olga" })).toEqual({
				user_id: "olga",
				customer_id: "acme",
				name: "Olga Petrova",
				email: "olga@new.example",
				last_login: iso(now),
			});
		});

		it("gives null name and email for a token that never carried them", async () => {
			const token = await stack.token("pat");
			const response = await get(token);
			expect(response.body).toMatchObject({ user_id: "pat", name: null, email: null });
		});
	});

	describe("internal actions", () => {
		// async, so that a validation error thrown synchronously by the broker becomes a rejection.
		const call = async <T>(action: string, params: unknown) => (await stack.app.broker.call(action, params)) as T;

		it("users.get returns the record or NotFoundError", async () => {
			await get(await stack.token("quinn", { name: "Quinn", email: "quinn@example.com", customer: "acme" }));
			expect(await call("users.get", { userId: "quinn" })).toEqual({
				user_id: "quinn",
				customer_id: "acme",
				name: "Quinn",
				email: "quinn@example.com",
				last_login: expect.any(String),
			});
			await expect(call("users.get", { userId: "nobody" })).rejects.toMatchObject({ code: 404, type: "not-found" });
			await expect(call("users.get", { userId: "bad id with spaces" })).rejects.toMatchObject({ name: "ValidationError" });
		});

		it("users.emailPreference, emailRecipients and setEmailPreference agree with the HTTP view", async () => {
			const rita = await stack.token("rita", { name: "Rita", email: "rita@example.com", customer: "acme" });
			const sam = await stack.token("sam", { email: "sam@example.com" });
			await put(rita, { notifications: [{ category: "imagery", settings: [{ topic: ARCHIVE_READY, email: true }] }] });
			await get(sam);

			expect(await call("users.emailPreference", { userId: "rita", topic: ARCHIVE_READY })).toEqual({
				userId: "rita",
				customerId: "acme",
				name: "Rita",
				email: "rita@example.com",
				enabled: true,
			});
			expect(await call("users.emailPreference", { userId: "sam", topic: ARCHIVE_READY })).toMatchObject({ userId: "sam", enabled: false });
			expect(await call("users.emailPreference", { userId: "nobody", topic: ARCHIVE_READY })).toEqual({
				userId: "nobody",
				customerId: null,
				name: null,
				email: null,
				enabled: false,
			});
			expect(await call("users.emailPreference", { userId: "rita", topic: DEBUG_TRACE })).toMatchObject({ enabled: false });

			const recipients = await call<Array<{ userId: string }>>("users.emailRecipients", { topic: ARCHIVE_READY });
			expect(recipients.filter(entry => ["rita", "sam"].includes(entry.userId))).toEqual([
				{ userId: "rita", customerId: "acme", name: "Rita", email: "rita@example.com" },
			]);

			// The one-click unsubscribe path: rita off, sam on.
			expect(await call("users.setEmailPreference", { userId: "rita", topic: ARCHIVE_READY, email: false })).toEqual({
				userId: "rita",
				topic: ARCHIVE_READY,
				email: false,
			});
			await call("users.setEmailPreference", { userId: "sam", topic: ARCHIVE_READY, email: true });
			expect(emailStates((await get(rita)).body)[ARCHIVE_READY]).toBe(false);
			expect(emailStates((await get(sam)).body)[ARCHIVE_READY]).toBe(true);
			const after = await call<Array<{ userId: string }>>("users.emailRecipients", { topic: ARCHIVE_READY });
			expect(after.map(entry => entry.userId)).toContain("sam");
			expect(after.map(entry => entry.userId)).not.toContain("rita");
			expect(await call("users.emailRecipients", { topic: DEBUG_TRACE })).toEqual([]);
		});

		it("users.setEmailPreference refuses topics without email and unknown users, changing nothing", async () => {
			await get(await stack.token("tess"));
			const before = await snapshot();
			await expect(call("users.setEmailPreference", { userId: "tess", topic: DEBUG_TRACE, email: true })).rejects.toMatchObject({
				code: 422,
				data: [{ path: "topic", message: expect.stringContaining("no email") }],
			});
			await expect(call("users.setEmailPreference", { userId: "tess", topic: "tasking:unheard_of", email: true })).rejects.toMatchObject({ code: 422 });
			await expect(call("users.setEmailPreference", { userId: "nobody", topic: ORDER_STATUS, email: true })).rejects.toMatchObject({ code: 404 });
			await expect(call("users.setEmailPreference", { userId: "tess", topic: ORDER_STATUS, email: "yes" })).rejects.toMatchObject({ name: "ValidationError" });
			expect(await snapshot()).toEqual(before);
		});
	});
});
