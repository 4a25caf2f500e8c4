// Hostile requests the gateway must refuse at its root (issue 9), on SQLite and PostgreSQL: each
// answer is checked for its status and problem details, and the database for being unchanged.
// OPTIONS never reaches an action; parameters come only from where a route documents them;
// "__proto__" is a plain unknown key; an error answer has written nothing; token claims,
// rate limits, names, URLs, answer sizes and headers follow the rules of docs/api.md.
import { setTimeout as sleep } from "node:timers/promises";
import type net from "node:net";
import os from "node:os";
import fs from "node:fs";
import path from "node:path";
import type { Knex } from "knex";
import { SignJWT, type JWTPayload } from "jose";
import { expectProblem, rejectionCheck, snapshotTables, startStack, type RequestOptions, type Stack, type TestResponse } from "./helpers/stack";
import { describeWhere, testDatabases } from "./helpers/services";
import { rawExchange } from "./helpers/raw-http";
import { scratchDatabase, type ScratchDatabase } from "./helpers/scratch-database";
import { deriveUnsubscribeKey, signUnsubscribeToken } from "../lib/unsubscribe-token";
import { runMigrations } from "../mixins/db.mixin";
import { webhooksMigrations } from "../migrations/webhooks";
import { createApp } from "../app";
import { parseConfig, resolveSecrets } from "../lib/config";
import { mintToken } from "../lib/auth";

const ORDER_STATUS = "tasking:order_status";
const TABLES = ["webhooks", "users", "user_email_preferences", "deliveries", "delivery_attempts", "delivery_messages"];
const ALLOWED_ORIGIN = "https://app.example.com";

/** Polls (bounded) until `check` holds, for states that settle asynchronously. */
async function eventually<T>(read: () => Promise<T>, check: (value: T) => boolean): Promise<T> {
	let value = await read();
	for (let i = 0; i < 150 && !check(value); i++) {
		await sleep(200);
		value = await read();
	}
	return value;
}

describe.each(testDatabases())("gateway hardening on %s", database => {
	let stack: Stack;
	let alice: string;
	let hook: { id: string; name: string; url: string; secret: string };
	let delivery: { id: string };
	let unsubscribeToken: string;
	const statuses: number[] = [];

	const tables = () => snapshotTables(stack.db, TABLES);
	const rejected = rejectionCheck(() => stack, TABLES, statuses);

	/** An answer without a body that must also leave the database as it was. */
	async function unchangedBy(method: string, urlPath: string, options: RequestOptions): Promise<TestResponse> {
		const before = await tables();
		const response = await stack.request(method, urlPath, options);
		statuses.push(response.status);
		expect(await tables()).toEqual(before);
		return response;
	}

	const sign = (claims: JWTPayload, header = { alg: "HS256" }) => new SignJWT(claims).setProtectedHeader(header).sign(new TextEncoder().encode(stack.config.AUTH_JWT_SECRET));
	const now = () => Math.floor(Date.now() / 1000);
	const errorPaths = (response: TestResponse) => (response.body.errors as Array<{ path: string }>).map(error => error.path);

	beforeAll(async () => {
		stack = await startStack({ database, env: { CORS_ORIGINS: ALLOWED_ORIGIN, WEBHOOK_ALLOW_NETS: "127.0.0.0/8", DELIVERY_RETRY_SCHEDULE: "10m,20m" } });
		alice = await stack.token("alice", { email: "alice@example.com" });
		const created = await stack.request("POST", "/id/v3/webhooks", { token: alice, body: { name: "Existing", url: "https://existing.example.com/in", events: [ORDER_STATUS] } });
		expect(created.status).toBe(201);
		hook = created.body;
		// A webhook whose deliveries fail at once (nothing listens on port 1), for the retry route.
		const failing = await stack.request("POST", "/id/v3/webhooks", { token: alice, body: { name: "Failing", url: "https://127.0.0.1:1/in", events: [ORDER_STATUS] } });
		expect(failing.status).toBe(201);
		await stack.app.broker.call("dispatcher.publish", { user_id: "alice", order_id: "o-1", status: "fulfilled" });
		// Both deliveries fail (the other webhook's host does not resolve), each on its own time: both
		// must have settled, waiting for a retry, before the tests compare the tables around each
		// refused request.
		const failedOnce = (webhookId: string) =>
			eventually(
				() => stack.db("deliveries").where({ webhook_id: webhookId }).first(),
				row => Boolean(row && row.attempt_count >= 1 && row.next_attempt_at),
			);
		const [settled, existing] = await Promise.all([failedOnce(failing.body.id), failedOnce(hook.id)]);
		delivery = settled;
		expect(settled).toMatchObject({ status: "pending", attempt_count: 1 });
		expect(existing).toMatchObject({ status: "pending", attempt_count: 1 });
		const turnedOn = await stack.request("PUT", "/id/v3/user/settings", { token: alice, body: { notifications: [{ category: "tasking", settings: [{ topic: ORDER_STATUS, email: true }] }] } });
		expect(turnedOn.status).toBe(200);
		unsubscribeToken = await signUnsubscribeToken({ userId: "alice", topic: ORDER_STATUS }, deriveUnsubscribeKey(stack.config.SECRETS_KEY!), 60_000);
	});
	afterAll(async () => {
		await stack?.stop();
	});
	afterEach(() => {
		expect(statuses.filter(status => status >= 500)).toEqual([]);
	});

	describe("OPTIONS and HEAD", () => {
		it("never runs the action a preflight names: delete, rotate, retry and unsubscribe change nothing", async () => {
			const preflights: Array<[string, string]> = [
				[`/id/v3/webhooks/${hook.id}`, "DELETE"],
				[`/id/v3/webhooks/${hook.id}`, "PATCH"],
				[`/id/v3/webhooks/${hook.id}/rotate`, "POST"],
				[`/id/v3/webhooks/${hook.id}/deliveries/${delivery.id}/retry`, "POST"],
				["/id/v3/webhooks", "POST"],
				[`/email/unsubscribe?token=${unsubscribeToken}`, "POST"],
			];
			for (const [urlPath, method] of preflights) {
				for (const origin of [ALLOWED_ORIGIN, "https://evil.example.net", undefined]) {
					const headers: Record<string, string> = { "access-control-request-method": method, ...(origin ? { origin } : {}) };
					const response = await unchangedBy("OPTIONS", urlPath, { token: alice, headers });
					expect({ urlPath, method, origin, status: response.status, text: response.text }).toEqual({ urlPath, method, origin, status: 204, text: "" });
					expect(response.headers.get("allow")).toContain(method);
				}
			}
			const details = await stack.request("GET", "/id/v3/user/details", { token: alice });
			expect(details.body.user_metadata.notifications[0].settings[0].email).toBe(true);
		});

		it("answers a CORS preflight from a configured origin, and nothing to another origin", async () => {
			const urlPath = `/id/v3/webhooks/${hook.id}`;
			const allowed = await unchangedBy("OPTIONS", urlPath, { headers: { origin: ALLOWED_ORIGIN, "access-control-request-method": "PATCH", "access-control-request-headers": "authorization, content-type" } });
			expect(allowed.status).toBe(204);
			expect(allowed.headers.get("access-control-allow-origin")).toBe(ALLOWED_ORIGIN);
			expect(allowed.headers.get("access-control-allow-methods")).toContain("PATCH");
			expect(allowed.headers.get("access-control-allow-headers")).toMatch(/Authorization.*Content-Type/);
			expect(allowed.headers.get("vary")).toContain("Origin");

			const foreign = await unchangedBy("OPTIONS", urlPath, { headers: { origin: "https://evil.example.net", "access-control-request-method": "DELETE" } });
			expect(foreign.status).toBe(204);
			expect(foreign.headers.get("access-control-allow-origin")).toBeNull();
			expect(foreign.headers.get("access-control-allow-methods")).toBeNull();

			// The real request from the allowed origin may be read by it; from another, not.
			const read = await stack.request("GET", urlPath, { token: alice, headers: { origin: ALLOWED_ORIGIN } });
			expect(read.status).toBe(200);
			expect(read.headers.get("access-control-allow-origin")).toBe(ALLOWED_ORIGIN);
			expect(read.headers.get("access-control-expose-headers")).toContain("ETag");
			const other = await stack.request("GET", urlPath, { token: alice, headers: { origin: "https://evil.example.net" } });
			expect(other.headers.get("access-control-allow-origin")).toBeNull();
		});

		it("answers a plain OPTIONS with 204 and Allow, and 404 for an unknown path", async () => {
			const known = await unchangedBy("OPTIONS", `/id/v3/webhooks/${hook.id}/rotate`, {});
			expect(known.status).toBe(204);
			expect(known.headers.get("allow")!.split(", ").sort()).toEqual(["OPTIONS", "POST"]);
			await rejected("OPTIONS", "/id/v3/nothing-here", { headers: { "access-control-request-method": "DELETE" } }, 404);
		});

		it("answers HEAD as GET without a body, and 405 where there is no GET", async () => {
			const head = await unchangedBy("HEAD", `/id/v3/webhooks/${hook.id}`, { token: alice });
			expect({ status: head.status, text: head.text, type: head.headers.get("content-type") }).toEqual({ status: 200, text: "", type: expect.stringContaining("application/json") });
			expect((await unchangedBy("HEAD", "/id/v3/webhooks?per_page=5", { token: alice })).status).toBe(200);
			expect((await unchangedBy("HEAD", "/id/v3/webhooks", {})).status).toBe(401);
			const rotate = await unchangedBy("HEAD", `/id/v3/webhooks/${hook.id}/rotate`, { token: alice });
			expect(rotate.status).toBe(405);
			expect(rotate.headers.get("allow")).toContain("POST");
		});

		it("answers 405 with Allow for a method a known path does not take", async () => {
			const put = await rejected("PUT", "/id/v3/webhooks", { token: alice, body: { name: "x" } }, 405);
			expect(put.headers.get("allow")!.split(", ").sort()).toEqual(["GET", "HEAD", "OPTIONS", "POST"]);
			await rejected("POST", `/id/v3/webhooks/${hook.id}`, { token: alice, body: { name: "x" } }, 405);
			await rejected("DELETE", "/id/v3/user/settings", { token: alice }, 405);
		});
	});

	describe("parameters come only from where the route documents them", () => {
		const fields = `name=by+query&url=${encodeURIComponent("https://query.example.com/in")}&events=${encodeURIComponent(ORDER_STATUS)}`;

		it("refuses a webhook described in the query string, with or without a body", async () => {
			const noBody = await rejected("POST", `/id/v3/webhooks?${fields}`, { token: alice }, 422);
			expect(errorPaths(noBody).sort()).toEqual(["events", "name", "url"]);
			expect(noBody.body.errors[0].message).toContain("not a query parameter");
			const overriding = await rejected("POST", `/id/v3/webhooks?url=${encodeURIComponent("https://override.example.com/")}`, { token: alice, body: { name: "Body", url: "https://body.example.com/", events: [ORDER_STATUS] } }, 422);
			expect(errorPaths(overriding)).toEqual(["url"]);
			await rejected("PATCH", `/id/v3/webhooks/${hook.id}?name=renamed`, { token: alice, body: { active: true } }, 422);
			await rejected("PATCH", `/id/v3/webhooks/${hook.id}?name=renamed`, { token: alice }, 422);
			await rejected("PUT", `/id/v3/user/settings?notifications=x`, { token: alice, body: { notifications: [] } }, 422);
			await rejected("POST", `/id/v3/webhooks/${hook.id}/rotate?x=1`, { token: alice }, 422);
			await rejected("DELETE", `/id/v3/webhooks/${hook.id}?confirm=yes`, { token: alice }, 422);
		});

		it("refuses unknown, repeated, bracketed and prototype-named query parameters on GET routes", async () => {
			for (const query of ["admin=true", "per_page[]=5", "per_page=5&per_page=6", "__proto__=x", "constructor=x", "per_page[x]=1", "status=failed"]) {
				const response = await rejected("GET", `/id/v3/webhooks?${query}`, { token: alice }, 422);
				expect(response.body.errors.length).toBeGreaterThan(0);
			}
			await rejected("GET", `/id/v3/user/details?user_id=bob`, { token: alice }, 422);
			await rejected("GET", `/id/v3/webhooks/${hook.id}/deliveries?status=failed&sort=desc`, { token: alice }, 422);
			// The documented ones still work.
			expect((await stack.request("GET", `/id/v3/webhooks/${hook.id}/deliveries?status=failed&per_page=5`, { token: alice })).status).toBe(200);
		});

		it("accepts only decimal digits for integers in the query", async () => {
			for (const value of ["0x10", "1e1", "%205", "%2B5", "5.0", "-1", "0", "101", "", "%EF%BC%95"]) {
				const response = await rejected("GET", `/id/v3/webhooks?per_page=${value}`, { token: alice }, 422);
				expect(response.body.errors).toEqual([{ path: "per_page", message: expect.stringContaining("decimal digits") }]);
			}
			const ok = await stack.request("GET", "/id/v3/webhooks?per_page=007", { token: alice });
			expect(ok.body.context.per_page).toBe(7);
		});
	});

	describe("__proto__ and constructor are plain unknown keys", () => {
		const wrapped = (inner: Record<string, unknown>) => `{"__proto__": ${JSON.stringify(inner)}}`;
		const headers = { "content-type": "application/json" };

		it("refuses them on create, update and settings, naming them", async () => {
			const create = await rejected("POST", "/id/v3/webhooks", { token: alice, headers, body: wrapped({ name: "Proto", url: "https://proto.example.com/", events: [ORDER_STATUS] }) }, 422);
			expect(create.body.errors).toEqual(expect.arrayContaining([{ path: "__proto__", message: "is not a known field" }]));
			const update = await rejected("PATCH", `/id/v3/webhooks/${hook.id}`, { token: alice, headers, body: wrapped({ name: "Proto", active: false }) }, 422);
			expect(update.body.errors).toEqual(expect.arrayContaining([{ path: "__proto__", message: "is not a known field" }]));
			const settings = await rejected("PUT", "/id/v3/user/settings", { token: alice, headers, body: wrapped({ notifications: [{ category: "tasking", settings: [{ topic: ORDER_STATUS, email: false }] }] }) }, 422);
			expect(JSON.stringify(settings.body.errors)).toContain("__proto__");
			const constructor = await rejected("POST", "/id/v3/webhooks", { token: alice, headers, body: `{"constructor": {"prototype": {"name": "x"}}, "name": "C", "url": "https://c.example.com/", "events": ["${ORDER_STATUS}"]}` }, 422);
			expect(JSON.stringify(constructor.body.errors)).toContain("constructor");
			const nested = await rejected("PUT", "/id/v3/user/settings", { token: alice, headers, body: `{"notifications": [{"category": "tasking", "settings": [{"__proto__": {"topic": "${ORDER_STATUS}", "email": false}}]}]}` }, 422);
			expect(JSON.stringify(nested.body.errors)).toMatch(/notifications\[0\]\.settings\[0\]/);
		});
	});

	describe("an error answer has written nothing", () => {
		it("answers junk after a Content-Length: 0 request with problem details, and creates nothing", async () => {
			const before = await tables();
			const fields = `name=junk&url=${encodeURIComponent("https://junk.example.com/in")}&events=${encodeURIComponent(ORDER_STATUS)}`;
			const responses = await rawExchange(
				stack.baseUrl,
				`POST /id/v3/webhooks?${fields} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer ${alice}\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n` +
					"\u0001\u0002 junk that is not HTTP \r\n\r\n",
			);
			expect(responses.length).toBeGreaterThan(0);
			for (const response of responses) {
				expect({ status: response.status, type: response.headers["content-type"] }).toEqual({ status: expect.any(Number), type: expect.stringContaining("application/problem+json") });
				expect(response.status).toBeGreaterThanOrEqual(400);
				expect(JSON.parse(response.body)).toMatchObject({ type: expect.any(String), title: expect.any(String), status: response.status, detail: expect.any(String) });
			}
			expect(await tables()).toEqual(before);
		});

		it("does not act on a valid request followed by junk on the same connection", async () => {
			const before = await tables();
			const body = JSON.stringify({ name: "Pipelined", url: "https://pipelined.example.com/in", events: [ORDER_STATUS] });
			const responses = await rawExchange(
				stack.baseUrl,
				`POST /id/v3/webhooks HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer ${alice}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}` +
					"GARBAGE\u0000\r\n\r\n",
			);
			expect(responses.map(response => response.status)).toEqual([400, 400]);
			for (const response of responses) expect(response.headers["content-type"]).toContain("application/problem+json");
			expect(await tables()).toEqual(before);
		});

		it("writes no user record for a request the gateway refuses, even from a new user", async () => {
			const refusals: Array<[string, string, RequestOptions, number]> = [
				["POST", "/id/v3/webhooks", { headers: { "content-type": "text/plain" }, body: "{}" }, 415],
				["POST", "/id/v3/webhooks", { headers: { "content-type": "application/json" }, body: "{not json" }, 400],
				["POST", "/id/v3/webhooks", { headers: { "content-type": "application/json" }, body: JSON.stringify({ name: "x".repeat(70_000) }) }, 413],
				["GET", "/id/v3/webhooks?admin=1", {}, 422],
				["PATCH", `/id/v3/webhooks/${hook.id}`, { body: { id: hook.id, active: false } }, 422],
			];
			for (const [index, [method, urlPath, options, status]] of refusals.entries()) {
				const token = await stack.token(`newcomer-${index}`, { email: `newcomer-${index}@example.com` });
				await rejected(method, urlPath, { ...options, token }, status);
			}
		});

		it("answers bare junk with problem details", async () => {
			const responses = await rawExchange(stack.baseUrl, "NOT HTTP AT ALL\r\n\r\n");
			expect(responses.map(response => [response.status, response.headers["content-type"]])).toEqual([[400, "application/problem+json"]]);
		});
	});

	describe("token claims", () => {
		it("answers 401 to every bad claim, and records no user", async () => {
			const cases: Array<[string, JWTPayload]> = [
				["iat ten days ahead", { sub: "mallory", iat: now() + 10 * 86_400, exp: now() + 20 * 86_400 }],
				["absurd iat", { sub: "mallory", iat: 1e12, exp: now() + 3600 }],
				["negative iat", { sub: "mallory", iat: -5, exp: now() + 3600 }],
				["auth_time ahead", { sub: "mallory", iat: now(), auth_time: now() + 86_400, exp: now() + 3600 }],
				["no exp", { sub: "mallory", iat: now() }],
				["nbf beyond the skew", { sub: "mallory", iat: now(), nbf: now() + 600, exp: now() + 3600 }],
				["string exp", { sub: "mallory", iat: now(), exp: String(now() + 3600) as unknown as number }],
			];
			for (const [label, claims] of cases) {
				const response = await rejected("GET", "/id/v3/user/details", { headers: { authorization: `Bearer ${await sign(claims)}` } }, 401);
				expect({ label, detail: response.body.detail }).toEqual({ label, detail: expect.stringMatching(/^Token/) });
				expect(response.headers.get("www-authenticate")).toMatch(/^Bearer/);
			}
			expect(await stack.db("users").where({ user_id: "mallory" })).toEqual([]);
		});

		it("allows AUTH_CLOCK_SKEW on iat and nbf, and never records a login in the future", async () => {
			const token = await sign({ sub: "skewed", iat: now() + 30, nbf: now() + 30, exp: now() + 3600 });
			const response = await stack.request("GET", "/id/v3/user/details", { headers: { authorization: `Bearer ${token}` } });
			expect(response.status).toBe(200);
			expect(Date.parse(response.body.last_login)).toBeLessThanOrEqual(Date.now());
		});

		it("matches the Bearer scheme in any case", async () => {
			for (const scheme of ["bearer", "BEARER", "bEaReR"]) {
				const response = await stack.request("GET", "/id/v3/webhooks/events", { headers: { authorization: `${scheme} ${alice}` } });
				expect({ scheme, status: response.status }).toEqual({ scheme, status: 200 });
			}
		});
	});

	describe("names and URLs", () => {
		const create = (body: Record<string, unknown>) => ({ token: alice, body: { name: "Fresh", url: "https://fresh.example.com/in", events: [ORDER_STATUS], ...body } });

		it("refuses lone surrogates, bidi overrides and zero-width characters in names, saying which", async () => {
			const lone = await rejected("POST", "/id/v3/webhooks", { token: alice, headers: { "content-type": "application/json" }, body: `{"name": "bad \\ud800 name", "url": "https://lone.example.com/", "events": ["${ORDER_STATUS}"]}` }, 422);
			expect(lone.body.errors).toEqual([{ path: "name", message: expect.stringContaining("lone UTF-16 surrogate") }]);
			for (const [name, code] of [["Existing\u202E", "U+202E"], ["Exi\u200Bsting", "U+200B"], ["\u2066Existing\u2069", "U+2066"], ["Exis\u00ADting", "U+00AD"], ["a\u2028b", "U+2028"]]) {
				const response = await rejected("POST", "/id/v3/webhooks", create({ name }), 422);
				expect(response.body.errors).toEqual([{ path: "name", message: expect.stringContaining(code) }]);
				await rejected("PATCH", `/id/v3/webhooks/${hook.id}`, { token: alice, body: { name } }, 422);
			}
		});

		it("treats composed and decomposed accents as one name", async () => {
			const composed = await stack.request("POST", "/id/v3/webhooks", create({ name: "Caf\u00e9", url: "https://cafe.example.com/in" }));
			expect(composed.status).toBe(201);
			await rejected("POST", "/id/v3/webhooks", create({ name: "Cafe\u0301", url: "https://cafe2.example.com/in" }), 409);
			expect((await stack.request("DELETE", `/id/v3/webhooks/${composed.body.id}`, { token: alice })).status).toBe(204);
		});

		it("normalises URLs before the uniqueness check: trailing dot, case, default port, IDN", async () => {
			for (const url of ["https://existing.example.com./in", "https://EXISTING.Example.COM/in", "https://existing.example.com:443/in", "HTTPS://existing.example.com.:443/in"]) {
				const response = await rejected("POST", "/id/v3/webhooks", create({ name: `dup ${url}`, url }), 409);
				expect(response.body.detail).toContain("URL");
			}
			const idn = await stack.request("POST", "/id/v3/webhooks", create({ name: "IDN", url: "https://Bücher.example./in" }));
			expect(idn.body.url).toBe("https://xn--bcher-kva.example/in");
			await rejected("POST", "/id/v3/webhooks", create({ name: "IDN again", url: "https://xn--bcher-kva.example/in" }), 409);
			expect((await stack.request("DELETE", `/id/v3/webhooks/${idn.body.id}`, { token: alice })).status).toBe(204);
		});

		it("refuses malformed hosts, empty credentials and IPv4-compatible IPv6 with a clear message", async () => {
			const cases: Array<[string, RegExp]> = [
				["https://./", /empty label/],
				["https://-/", /not valid/],
				["https://a..b/", /empty label/],
				["https://example.com../in", /empty label/],
				["https://-bad.example.com/", /not valid/],
				["https://bad-.example.com/", /not valid/],
				[`https://${"a".repeat(64)}.example.com/`, /not valid/],
				["https://:@existing.example.com/in", /user name or password/],
				["https://@existing.example.com/in", /user name or password/],
				["https://[::127.0.0.1]/", /IPv4-compatible IPv6 address.*127\.0\.0\.1/],
			];
			for (const [url, message] of cases) {
				const response = await rejected("POST", "/id/v3/webhooks", create({ url }), 422);
				expect({ url, errors: response.body.errors }).toEqual({ url, errors: [{ path: "url", message: expect.stringMatching(message) }] });
			}
		});
	});

	describe("bounded answers", () => {
		it("lists at most 50 errors and counts the rest", async () => {
			const settings = Array.from({ length: 190 }, (_, i) => ({ topic: `tasking:t${i}`, email: "yes" }));
			const notifications = Array.from({ length: 6 }, () => ({ category: "tasking", settings }));
			const response = await rejected("PUT", "/id/v3/user/settings", { token: alice, body: { notifications } }, 422);
			expect(response.body.errors).toHaveLength(50);
			expect(response.body.errors_omitted).toBeGreaterThan(1_000);
			expect(response.text.length).toBeLessThan(16 * 1024);
		});
	});

	describe("headers", () => {
		it("marks every API answer no-store and nosniff, secrets included", async () => {
			const created = await stack.request("POST", "/id/v3/webhooks", { token: alice, body: { name: "Headers", url: "https://headers.example.com/in", events: [ORDER_STATUS] } });
			const rotated = await stack.request("POST", `/id/v3/webhooks/${created.body.id}/rotate`, { token: alice });
			const failed = await stack.request("GET", "/id/v3/webhooks/not-a-uuid", { token: alice });
			const unauthenticated = await stack.request("GET", "/id/v3/webhooks");
			for (const response of [created, rotated, failed, unauthenticated]) {
				expect({ cache: response.headers.get("cache-control"), sniff: response.headers.get("x-content-type-options") }).toEqual({ cache: "no-store", sniff: "nosniff" });
			}
			expect(created.body.secret).toMatch(/^whsec_/);
			expect((await stack.request("DELETE", `/id/v3/webhooks/${created.body.id}`, { token: alice })).status).toBe(204);
		});

		it("echoes a short, plain X-Request-Id and replaces any other", async () => {
			const plain = await stack.request("GET", "/id/v3/webhooks/events", { token: alice, headers: { "x-request-id": "req-42.a_b" } });
			expect(plain.headers.get("x-request-id")).toBe("req-42.a_b");
			for (const hostile of ["<script>alert(1)</script>", "x".repeat(65), "a b", "caf\u00e9"]) {
				const response = await stack.request("GET", "/id/v3/webhooks/events", { token: alice, headers: { "x-request-id": hostile } });
				expect(response.headers.get("x-request-id")).toMatch(/^[0-9a-f-]{36}$/);
			}
			const failed = await stack.request("GET", "/id/v3/webhooks", { headers: { "x-request-id": "<b>" } });
			expect(failed.headers.get("x-request-id")).toMatch(/^[0-9a-f-]{36}$/);
		});
	});
});

describe.each(testDatabases())("rate limits on %s", database => {
	let stack: Stack;

	beforeAll(async () => {
		stack = await startStack({ services: ["api", "topics", "webhooks"], database, env: { RATE_LIMIT_PER_MINUTE: "3", RATE_LIMIT_PER_ADDRESS_PER_MINUTE: "8" } });
	});
	afterAll(() => stack?.stop());

	it("limits the customer, not the token: a second token of the same user shares the budget", async () => {
		const first = await stack.token("hasty", { customer: "acme" });
		const second = await stack.token("hasty", { customer: "acme", email: "hasty@example.com" });
		expect((await stack.request("GET", "/id/v3/webhooks", { token: first })).status).toBe(200);
		expect((await stack.request("GET", "/id/v3/webhooks", { headers: { authorization: `bearer  ${first}` } })).status).toBe(200);
		expect((await stack.request("GET", "/id/v3/webhooks", { token: second })).status).toBe(200);

		const before = await snapshotTables(stack.db, ["webhooks"]);
		const limited = await stack.request("POST", "/id/v3/webhooks", { token: second, body: { name: "too many", url: "https://hasty.example.com/in", events: [ORDER_STATUS] } });
		expectProblem(limited, 429);
		expect(await snapshotTables(stack.db, ["webhooks"])).toEqual(before);
		const firstWait = Number(limited.headers.get("retry-after"));
		expect(firstWait).toBeGreaterThan(0);
		expect(firstWait).toBeLessThanOrEqual(60);

		// Retry-After is the real time left in the window, not a constant.
		await sleep(1_500);
		const later = await stack.request("GET", "/id/v3/webhooks", { token: first });
		expectProblem(later, 429);
		expect(Number(later.headers.get("retry-after"))).toBeLessThan(firstWait);

		// The budget is the customer's: another user of it waits too, another customer does not.
		expectProblem(await stack.request("GET", "/id/v3/webhooks", { token: await stack.token("calm", { customer: "acme" }) }), 429);
		expect((await stack.request("GET", "/id/v3/webhooks", { token: await stack.token("calm", { customer: "zeta" }) })).status).toBe(200);
	});

	it("counts requests with bad tokens against the client address", async () => {
		// Eight requests per address per minute; four were used by the test above.
		const garbage = await new SignJWT({ sub: "x" }).setProtectedHeader({ alg: "HS256" }).setExpirationTime("1h").sign(new TextEncoder().encode("k".repeat(48)));
		const answers: number[] = [];
		for (let i = 0; i < 8; i++) answers.push((await stack.request("GET", "/id/v3/webhooks", { headers: { authorization: `Bearer ${garbage}` } })).status);
		expect(answers.filter(status => status === 401).length).toBeGreaterThan(0);
		expect(answers.at(-1)).toBe(429);
		const limited = await stack.request("POST", "/id/v3/webhooks", { token: await stack.token("fresh"), body: { name: "n", url: "https://n.example.com/", events: [ORDER_STATUS] } });
		expectProblem(limited, 429);
		expect(Number(limited.headers.get("retry-after"))).toBeGreaterThan(0);
		expect(await stack.db("webhooks").count({ count: "*" })).toEqual([{ count: database === "postgres" ? "0" : 0 }]);
	});
});

describe.each(testDatabases())("stored URLs normalised by migration on %s", database => {
	let db: Knex;
	let scratch: ScratchDatabase | undefined;

	beforeAll(async () => {
		scratch = await scratchDatabase(database, "migrate");
		db = scratch.db;
	});
	afterAll(() => scratch?.drop());

	it("drops the host's trailing dot, except where the customer already has the dot-less twin", async () => {
		await runMigrations(db, "webhooks", webhooksMigrations.slice(0, 1));
		const row = (id: string, customer: string, url: string) => ({
			id,
			customer_id: customer,
			name: id,
			url,
			events: "[]",
			active: true,
			secret_envelope: "x",
			created_at: "2026-01-01T00:00:00.000Z",
			updated_at: "2026-01-01T00:00:00.000Z",
		});
		await db("webhooks").insert([
			row("a", "acme", "https://hooks.example.com./in"),
			row("b", "acme", "https://other.example.com.:8443/x"),
			row("c", "zeta", "https://twin.example.com./in"),
			row("d", "zeta", "https://twin.example.com/in"),
			row("e", "zeta", "https://path.example.com/v1./in"),
		]);
		await runMigrations(db, "webhooks", webhooksMigrations);
		const urls = Object.fromEntries((await db("webhooks").select("id", "url")).map((r: { id: string; url: string }) => [r.id, r.url]));
		expect(urls).toEqual({
			a: "https://hooks.example.com/in",
			b: "https://other.example.com:8443/x",
			c: "https://twin.example.com./in",
			d: "https://twin.example.com/in",
			e: "https://path.example.com/v1./in",
		});
	});
});

// Only a caller from outside loopback shows the difference: without such an address the suite is
// skipped on a laptop, and fails in CI, which must run it.
const external = Object.values(os.networkInterfaces())
	.flat()
	.find(entry => entry && entry.family === "IPv4" && !entry.internal)?.address;

describeWhere({ programs: { "a non-loopback IPv4 address": external !== undefined } })("health details", () => {
	it("shows the node id and checks only to a loopback or authenticated caller", async () => {
		const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-health-"));
		const config = parseConfig({ NODE_ENV: "test", PORT: "0", OPS_PORT: "0", HOST: "0.0.0.0", DATA_DIR: dataDir, SERVICES: "api,topics" });
		resolveSecrets(config);
		const app = createApp(config, { ops: true, broker: { logger: false } });
		await app.start();
		try {
			const port = (app.opsServer!.address() as net.AddressInfo).port;
			const outside = await fetch(`http://${external}:${port}/health`);
			expect(outside.status).toBe(200);
			expect(await outside.json()).toEqual({ status: "ok" });
			const badToken = await fetch(`http://${external}:${port}/health`, { headers: { authorization: "Bearer not.a.token" } });
			expect(await badToken.json()).toEqual({ status: "ok" });

			const token = await mintToken(config, { sub: "operator" });
			const authenticated = await fetch(`http://${external}:${port}/health`, { headers: { authorization: `Bearer ${token}` } });
			expect(await authenticated.json()).toMatchObject({ status: "ok", node: app.broker.nodeID, services: expect.arrayContaining(["api"]) });
			const loopback = await fetch(`http://127.0.0.1:${port}/health`);
			expect(await loopback.json()).toMatchObject({ status: "ok", node: app.broker.nodeID });
		} finally {
			await app.stop();
			fs.rmSync(dataDir, { recursive: true, force: true });
		}
	});
});
