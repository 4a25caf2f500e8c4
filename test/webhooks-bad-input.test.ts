// Bad input to the webhook routes gets the documented status and problem details, never a 500,
// and leaves the database exactly as it was: on SQLite and PostgreSQL.
import { SignJWT, UnsecuredJWT } from "jose";
import { expectProblem, rejectionCheck, snapshotTables, startStack, type Stack, type TestResponse } from "./helpers/stack";
import { testDatabases } from "./helpers/services";

const SERVICES = ["api", "topics", "webhooks"] as const;
const ORDER_STATUS = "tasking:order_status";
const MALFORMED_IDS = ["not-a-uuid", "123", "3f1c1d2e-1111-4222-8333-44445555666", "3f1c1d2e-1111-4222-8333-4444555566667", "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz", "%27%20OR%201%3D1--"];

const HOSTILE_URLS: Array<[url: string, message: RegExp]> = [
	["http://hooks.example.com/in", /HTTP is not supported/],
	["HTTP://hooks.example.com/in", /HTTP is not supported/],
	["https://user:password@hooks.example.com/in", /user name or password/],
	["https://user@hooks.example.com/in", /user name or password/],
	["https://10.1.2.3/in", /private/],
	["https://172.16.0.1/in", /private/],
	["https://192.168.1.1/in", /private/],
	["https://127.0.0.1/in", /loopback/],
	["https://127.1/in", /loopback/],
	["https://0x7f000001/in", /loopback/],
	["https://2130706433/in", /loopback/],
	["https://169.254.169.254/latest/meta-data", /link local/],
	["https://100.64.0.1/in", /carrier grade nat/],
	["https://0.0.0.0/in", /unspecified/],
	["https://224.0.0.1/in", /multicast/],
	["https://[::1]/in", /loopback/],
	["https://[::ffff:127.0.0.1]/in", /loopback/],
	["https://[::ffff:10.0.0.1]/in", /private/],
	["https://[fe80::1]/in", /link local/],
	["https://[fd00::1]/in", /unique local/],
	["https://[64:ff9b::a00:1]/in", /rfc6052|nat/i],
	["https://localhost/in", /loopback/],
	["https://LOCALHOST./in", /loopback/],
	["https://api.localhost/in", /loopback/],
	[`https://hooks.example.com/${"a".repeat(2100)}`, /at most 2048 characters/],
	[`https://hooks.example.com/${"é".repeat(1000)}`, /at most 2048 characters once normalised/],
	["hooks.example.com/in", /absolute URL/],
	["not a url", /spaces/],
	["", /absolute URL/],
	["https://", /not a valid URL|absolute URL/],
	["https:hooks.example.com", /absolute URL/],
	["https:///hooks.example.com", /absolute URL/],
	["https://hooks.example.com/in#section", /fragment/],
	["https://exa\nmple.com/in", /control characters/],
	["https://hooks.example.com:99999/in", /not a valid URL/],
	["javascript:alert(1)", /javascript: scheme is not supported/],
	["file:///etc/passwd", /file: scheme is not supported/],
	["ftp://hooks.example.com/in", /ftp: scheme is not supported/],
	["data:text/plain,hello", /data: scheme is not supported/],
	["gopher://127.0.0.1:6379/_INFO", /gopher: scheme is not supported/],
];

describe.each(testDatabases())("webhook bad input on %s", database => {
	let stack: Stack;
	let alice: string;
	let bob: string;
	let alicesHook: { id: string; name: string; url: string };
	let bobsHook: { id: string };
	const statuses: number[] = [];

	const rejected = rejectionCheck(() => stack, ["webhooks"], statuses);

	const validBody = (overrides: Record<string, unknown> = {}) => ({ name: "valid name", url: "https://valid.example.com/in", events: [ORDER_STATUS], ...overrides });
	const errorPaths = (response: TestResponse) => (response.body.errors as Array<{ path: string }>).map(error => error.path);

	beforeAll(async () => {
		stack = await startStack({ services: [...SERVICES], database });
		alice = await stack.token("alice");
		bob = await stack.token("bob", { customer: "acme" });
		await stack.app.broker.call("topics.register", {
			topic: "internal:audit",
			category: "internal",
			name: "Audit trail",
			description: "Not offered to webhooks",
			webhooks: false,
		});
		const created = await stack.request("POST", "/id/v3/webhooks", { token: alice, body: { name: "Existing", url: "https://existing.example.com/in", events: [ORDER_STATUS] } });
		alicesHook = created.body;
		bobsHook = (await stack.request("POST", "/id/v3/webhooks", { token: bob, body: { name: "Bob's", url: "https://bob.example.com/in", events: [ORDER_STATUS] } })).body;
		expect([alicesHook.id, bobsHook.id]).toEqual([expect.any(String), expect.any(String)]);
	});
	afterAll(async () => {
		await stack?.stop();
	});
	afterEach(() => {
		expect(statuses.filter(status => status >= 500)).toEqual([]);
	});

	it("answers 400 for a body that is not valid JSON", async () => {
		const headers = { "content-type": "application/json" };
		for (const body of ['{"name": "x", ', "{name: 'x'}", '{"name": "x"} trailing', "\u0000"]) {
			await rejected("POST", "/id/v3/webhooks", { token: alice, headers, body }, 400);
			await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, headers, body }, 400);
		}
	});

	it("answers 422 for a body that is a JSON array, string, number or boolean", async () => {
		const headers = { "content-type": "application/json" };
		for (const body of ["[]", '[{"name":"x"}]', '"a string"', "42", "true"]) {
			await rejected("POST", "/id/v3/webhooks", { token: alice, headers, body }, 422);
			await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, headers, body }, 422);
		}
	});

	it("answers 413 for a 1 MiB body", async () => {
		const huge = JSON.stringify(validBody({ name: "x".repeat(1024 * 1024) }));
		await rejected("POST", "/id/v3/webhooks", { token: alice, headers: { "content-type": "application/json" }, body: huge }, 413);
		await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, headers: { "content-type": "application/json" }, body: huge }, 413);
	});

	it("answers 415 for a body without a JSON content type", async () => {
		const body = JSON.stringify(validBody());
		for (const type of ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml"]) {
			await rejected("POST", "/id/v3/webhooks", { token: alice, headers: { "content-type": type }, body }, 415);
			await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, headers: { "content-type": type }, body: '{"active":false}' }, 415);
		}
	});

	it("answers 422 naming each missing field", async () => {
		const response = await rejected("POST", "/id/v3/webhooks", { token: alice, body: {} }, 422);
		expect(errorPaths(response).sort()).toEqual(["events", "name", "url"]);
		const noEvents = await rejected("POST", "/id/v3/webhooks", { token: alice, body: { name: "n", url: "https://n.example.com/" } }, 422);
		expect(noEvents.body.errors).toEqual([{ path: "events", message: expect.stringContaining("event_types") }]);
		// With no body at all.
		const empty = await rejected("POST", "/id/v3/webhooks", { token: alice }, 422);
		expect(errorPaths(empty).sort()).toEqual(["events", "name", "url"]);
	});

	it("answers 422 naming each field of the wrong type", async () => {
		const cases: Array<[Record<string, unknown>, string]> = [
			[validBody({ name: 5 }), "name"],
			[validBody({ name: null }), "name"],
			[validBody({ name: ["a"] }), "name"],
			[validBody({ url: 7 }), "url"],
			[validBody({ url: { href: "https://x.example.com" } }), "url"],
			[validBody({ events: ORDER_STATUS }), "events"],
			[validBody({ events: [1] }), "events[0]"],
			[validBody({ events: [ORDER_STATUS, null] }), "events[1]"],
			[validBody({ events: undefined, event_types: "x" }), "event_types"],
		];
		for (const [body, path] of cases) {
			const response = await rejected("POST", "/id/v3/webhooks", { token: alice, body }, 422);
			expect({ body, paths: errorPaths(response) }).toEqual({ body, paths: [path] });
		}
		const patchCases: Array<[Record<string, unknown>, string]> = [
			[{ active: "false" }, "active"],
			[{ active: 0 }, "active"],
			[{ name: 12 }, "name"],
			[{ events: {} }, "events"],
		];
		for (const [body, path] of patchCases) {
			const response = await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, body }, 422);
			expect({ body, paths: errorPaths(response) }).toEqual({ body, paths: [path] });
		}
	});

	it("answers 422 listing every problem at once", async () => {
		const response = await rejected("POST", "/id/v3/webhooks", { token: alice, body: { name: "", url: 3, events: [] } }, 422);
		expect(errorPaths(response).sort()).toEqual(["events", "name", "url"]);
		const policy = await rejected("POST", "/id/v3/webhooks", { token: alice, body: validBody({ url: "https://u:p@127.0.0.1/#x", events: ["nope:nope"] }) }, 422);
		expect(errorPaths(policy)).toEqual(["url", "url", "url", "events[0]"]);
	});

	it("answers 422 for unknown fields, each at its own name as path", async () => {
		const response = await rejected("POST", "/id/v3/webhooks", { token: alice, body: validBody({ colour: "red", secret: "whsec_mine" }) }, 422);
		expect(response.body.errors).toEqual([
			{ path: "colour", message: "is not a known field" },
			{ path: "secret", message: "is not a known field" },
		]);
		const patch = await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, body: { active: true, created_at: "2020-01-01T00:00:00Z" } }, 422);
		expect(patch.body.errors).toEqual([{ path: "created_at", message: "is not a known field" }]);
		// Query parameters count as input too.
		await rejected("POST", "/id/v3/webhooks?admin=true", { token: alice, body: validBody() }, 422);
	});

	it("answers 422 for names that are empty, too long or hold control characters", async () => {
		for (const name of ["", "   ", "x".repeat(101), "line\nbreak", "nul\u0000"]) {
			const response = await rejected("POST", "/id/v3/webhooks", { token: alice, body: validBody({ name }) }, 422);
			expect(errorPaths(response)).toEqual(["name"]);
			await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, body: { name } }, 422);
		}
	});

	it("answers 422 for hostile and malformed URLs, saying why", async () => {
		for (const [url, message] of HOSTILE_URLS) {
			const response = await rejected("POST", "/id/v3/webhooks", { token: alice, body: validBody({ url }) }, 422);
			expect({ url, errors: response.body.errors }).toEqual({ url, errors: expect.arrayContaining([{ path: "url", message: expect.stringMatching(message) }]) });
		}
	});

	it("answers 422 for event lists that are empty, unknown, not offered to webhooks, or contradictory", async () => {
		await rejected("POST", "/id/v3/webhooks", { token: alice, body: validBody({ events: [] }) }, 422);
		const unknown = await rejected("POST", "/id/v3/webhooks", { token: alice, body: validBody({ events: [ORDER_STATUS, "tasking:order_deleted"] }) }, 422);
		expect(unknown.body.errors).toEqual([{ path: "events[1]", message: expect.stringContaining('"tasking:order_deleted"') }]);
		expect(unknown.body.detail).toContain("tasking:order_deleted");
		const internal = await rejected("POST", "/id/v3/webhooks", { token: alice, body: validBody({ events: ["internal:audit"] }) }, 422);
		expect(internal.body.errors[0].message).toContain("internal:audit");
		const contradictory = await rejected("POST", "/id/v3/webhooks", { token: alice, body: validBody({ event_types: ["tasking:other"] }) }, 422);
		expect(errorPaths(contradictory)).toEqual(["event_types"]);
		await rejected("POST", "/id/v3/webhooks", { token: alice, body: validBody({ events: Array.from({ length: 51 }, (_, i) => `tasking:t${i}`) }) }, 422);

		const patchUnknown = await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, body: { events: ["tasking:order_deleted"] } }, 422);
		expect(patchUnknown.body.errors[0].message).toContain("tasking:order_deleted");
		await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, body: { events: [] } }, 422);
		await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, body: { events: [ORDER_STATUS], event_types: ["internal:audit"] } }, 422);
	});

	it("answers 422 for an ordering other than per_order or none, on create and PATCH, naming the two values", async () => {
		// Long, but within the 64 KiB body limit: the field refuses it, not the gateway.
		const oversized = "per_order".repeat(6_000);
		const wrong: unknown[] = [1, 0, true, "", " per_order", "PER_ORDER", "Per_Order", "per-order", "none ", "NONE", "fifo", null, {}, { value: "none" }, ["per_order"], oversized];
		for (const ordering of wrong) {
			const created = await rejected("POST", "/id/v3/webhooks", { token: alice, body: validBody({ name: "ordered wrongly", url: "https://ordering.example.com/in", ordering }) }, 422);
			expect({ ordering, errors: created.body.errors }).toEqual({ ordering, errors: [{ path: "ordering", message: 'must be "per_order" (the default) or "none"' }] });
			expect(created.text.length).toBeLessThan(2_000);
			const patched = await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, body: { ordering } }, 422);
			expect({ ordering, errors: patched.body.errors }).toEqual({ ordering, errors: [{ path: "ordering", message: 'must be "per_order" (the default) or "none"' }] });
			// Beside a good field, the good one is not applied either.
			await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, body: { name: "renamed by a bad request", ordering } }, 422);
		}
		// Not from the query string either: only the body carries it.
		await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}?ordering=none`, { token: alice, body: { name: "renamed via query" } }, 422);
		const answer = await stack.request("GET", `/id/v3/webhooks/${alicesHook.id}`, { token: alice });
		expect(answer.body).toMatchObject({ name: alicesHook.name, ordering: "per_order" });
	});

	it("answers 422 for a rate_limit that is not a whole number from 1 to 10000 or null, on create and PATCH, naming the range", async () => {
		const RANGE = "must be a whole number of deliveries per second from 1 to 10000, or null for no limit";
		const wrong: unknown[] = [
			0,
			-1,
			-10_000,
			10_001,
			1.5,
			0.5,
			9_999.999,
			1e308,
			2 ** 53 + 2,
			Number.MAX_SAFE_INTEGER,
			"10",
			"",
			" 5",
			"1e3",
			"NaN",
			"Infinity",
			"-Infinity",
			"0x10",
			"ten",
			true,
			false,
			{},
			{ value: 10 },
			[],
			[10],
			"9".repeat(30_000),
		];
		for (const rate_limit of wrong) {
			const created = await rejected("POST", "/id/v3/webhooks", { token: alice, body: validBody({ name: "limited wrongly", url: "https://limit.example.com/in", rate_limit }) }, 422);
			expect({ rate_limit, errors: created.body.errors }).toEqual({ rate_limit, errors: [{ path: "rate_limit", message: RANGE }] });
			expect(created.text.length).toBeLessThan(2_000);
			const patched = await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, body: { rate_limit } }, 422);
			expect({ rate_limit, errors: patched.body.errors }).toEqual({ rate_limit, errors: [{ path: "rate_limit", message: RANGE }] });
			// Beside a good field, the good one is not applied either.
			await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, body: { name: "renamed by a bad request", rate_limit } }, 422);
		}
		// Numbers JSON.parse turns into Infinity: refused at the field, not stored as a limit.
		const headers = { "content-type": "application/json" };
		for (const literal of ["1e400", `1${"0".repeat(400)}`, "-1e400"]) {
			const patched = await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, headers, body: `{"rate_limit": ${literal}}` }, 422);
			expect(patched.body.errors).toEqual([{ path: "rate_limit", message: RANGE }]);
		}
		// NaN is not JSON at all.
		await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, headers, body: '{"rate_limit": NaN}' }, 400);
		// Not from the query string either: only the body carries it.
		await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}?rate_limit=5`, { token: alice, body: { name: "renamed via query" } }, 422);
		const answer = await stack.request("GET", `/id/v3/webhooks/${alicesHook.id}`, { token: alice });
		expect(answer.body).toMatchObject({ name: alicesHook.name, rate_limit: null });
	});

	it("answers 422 to a PATCH that tries to change the URL, or changes nothing", async () => {
		const response = await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, body: { url: "https://new.example.com/in" } }, 422);
		expect(response.body.errors).toEqual([{ path: "url", message: expect.stringContaining("create a new webhook") }]);
		// Even the same URL: it is not a field that PATCH takes.
		await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, body: { url: alicesHook.url, name: "renamed" } }, 422);
		const nothing = await rejected("PATCH", `/id/v3/webhooks/${alicesHook.id}`, { token: alice, body: {} }, 422);
		expect(nothing.body.errors[0].message).toMatch(/at least one of name/);
	});

	it("answers 422 for malformed ids on every route", async () => {
		for (const id of MALFORMED_IDS) {
			const response = await rejected("GET", `/id/v3/webhooks/${id}`, { token: alice }, 422);
			expect(errorPaths(response)).toEqual(["id"]);
			await rejected("PATCH", `/id/v3/webhooks/${id}`, { token: alice, body: { active: false } }, 422);
			await rejected("DELETE", `/id/v3/webhooks/${id}`, { token: alice }, 422);
			await rejected("POST", `/id/v3/webhooks/${id}/rotate`, { token: alice }, 422);
		}
	});

	it("answers 404 alike for unknown ids and for another customer's ids", async () => {
		for (const id of [crypto.randomUUID(), bobsHook.id, bobsHook.id.toUpperCase()]) {
			const answers = [
				await rejected("GET", `/id/v3/webhooks/${id}`, { token: alice }, 404),
				await rejected("PATCH", `/id/v3/webhooks/${id}`, { token: alice, body: { name: "mine now", active: false } }, 404),
				await rejected("PATCH", `/id/v3/webhooks/${id}`, { token: alice, body: { ordering: "none" } }, 404),
				await rejected("PATCH", `/id/v3/webhooks/${id}`, { token: alice, body: { rate_limit: 1 } }, 404),
				await rejected("PATCH", `/id/v3/webhooks/${id}`, { token: alice, body: { rate_limit: null } }, 404),
				await rejected("DELETE", `/id/v3/webhooks/${id}`, { token: alice }, 404),
				await rejected("POST", `/id/v3/webhooks/${id}/rotate`, { token: alice }, 404),
			];
			for (const answer of answers) expect(answer.body.detail).toBe("Webhook not found");
		}
		// A body with someone else's id cannot redirect a PATCH: the id comes from the path only.
		const redirected = await rejected("PATCH", `/id/v3/webhooks/${crypto.randomUUID()}`, { token: alice, body: { id: alicesHook.id, active: false } }, 422);
		expect(redirected.body.errors).toEqual([{ path: "id", message: expect.stringContaining("URL path") }]);
	});

	it("answers 409, changing nothing, for a duplicate name or URL", async () => {
		await rejected("POST", "/id/v3/webhooks", { token: alice, body: validBody({ name: alicesHook.name }) }, 409);
		await rejected("POST", "/id/v3/webhooks", { token: alice, body: validBody({ url: alicesHook.url }) }, 409);
	});

	it("answers 422 for bad paging parameters", async () => {
		for (const query of ["per_page=0", "per_page=101", "per_page=abc", "per_page=1.5", "per_page=1&per_page=2", "token=not-a-token", `token=${"A".repeat(600)}`, "page=2"]) {
			await rejected("GET", `/id/v3/webhooks?${query}`, { token: alice }, 422);
		}
	});

	it("answers 401 for unsigned, expired and wrongly signed tokens", async () => {
		const secret = new TextEncoder().encode(stack.config.AUTH_JWT_SECRET);
		const unsigned = new UnsecuredJWT({}).setSubject("alice").setIssuedAt().setExpirationTime("1h").encode();
		const expired = await new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("alice").setIssuedAt(1_000).setExpirationTime(2_000).sign(secret);
		const wrongKey = await new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("alice").setIssuedAt().setExpirationTime("1h").sign(new TextEncoder().encode("k".repeat(48)));
		for (const token of [unsigned, expired, wrongKey]) {
			const headers = { authorization: `Bearer ${token}` };
			const response = await rejected("POST", "/id/v3/webhooks", { headers, body: validBody({ name: "by intruder", url: "https://intruder.example.com/" }) }, 401);
			expect(response.headers.get("www-authenticate")).toMatch(/^Bearer/);
			await rejected("GET", `/id/v3/webhooks/${alicesHook.id}`, { headers }, 401);
			await rejected("DELETE", `/id/v3/webhooks/${alicesHook.id}`, { headers }, 401);
			await rejected("POST", `/id/v3/webhooks/${alicesHook.id}/rotate`, { headers }, 401);
		}
		await rejected("GET", "/id/v3/webhooks", {}, 401);
	});

	it("still serves the untouched webhook afterwards", async () => {
		const response = await stack.request("GET", `/id/v3/webhooks/${alicesHook.id}`, { token: alice });
		expect(response.status).toBe(200);
		expect(response.body).toEqual({ ...alicesHook, secret: undefined });
	});
});

describe.each(testDatabases())("webhook rate limit on %s", database => {
	let stack: Stack;

	beforeAll(async () => {
		stack = await startStack({ services: [...SERVICES], database, env: { RATE_LIMIT_PER_MINUTE: "3" } });
	});
	afterAll(() => stack?.stop());

	it("answers 429 with Retry-After once a token has used its requests, and creates nothing", async () => {
		const token = await stack.token("hasty");
		for (let i = 0; i < 3; i += 1) expect((await stack.request("GET", "/id/v3/webhooks", { token })).status).toBe(200);

		const before = await snapshotTables(stack.db, ["webhooks"]);
		const response = await stack.request("POST", "/id/v3/webhooks", {
			token,
			body: { name: "too many", url: "https://hasty.example.com/in", events: [ORDER_STATUS] },
		});
		expectProblem(response, 429);
		expect(Number(response.headers.get("retry-after"))).toBeGreaterThan(0);
		expect(await snapshotTables(stack.db, ["webhooks"])).toEqual(before);
	});
});
