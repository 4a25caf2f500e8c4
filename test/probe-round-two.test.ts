// What a second hostile probe found (issue 34), on SQLite and PostgreSQL: each case failed before
// its fix. Customers and users do not share ids; a refused request writes nothing, path
// parameters included; an IPv4 allowance does not open its IPv6 forms; bodies are UTF-8 JSON
// without repeated keys; framing the gateway cannot trust gets a problem answer; tokens expire
// within a bound; slow clients cannot hold the gateway; the rate limit is per customer.
import { setTimeout as sleep } from "node:timers/promises";
import net from "node:net";
import crypto from "node:crypto";
import type { Knex } from "knex";
import { SignJWT, type JWTPayload } from "jose";
import { expectProblem, rejectionCheck, snapshotTables, startStack, type Stack } from "./helpers/stack";
import { testDatabases } from "./helpers/services";
import { scratchDatabase, type ScratchDatabase } from "./helpers/scratch-database";
import { rawExchange, parseRawResponses } from "./helpers/raw-http";
import { runMigrations } from "../mixins/db.mixin";
import { webhooksMigrations } from "../migrations/webhooks";
import { usersMigrations } from "../migrations/users";
import { dispatcherMigrations } from "../migrations/dispatcher";
import { guardedLookup, WebhookSender } from "../lib/webhook-sender";
import { isBlockedAddress, parseAllowList } from "../lib/address-ranges";
import { generateWebhookSecret } from "../lib/crypto";
import { repeatedKey } from "../lib/json-body";

const ORDER_STATUS = "tasking:order_status";
const TABLES = ["webhooks", "users", "user_email_preferences", "deliveries", "delivery_attempts", "delivery_messages"];

const hookBody = (name: string, host = `${crypto.randomBytes(4).toString("hex")}.example.com`) => ({ name, url: `https://${host}/in`, events: [ORDER_STATUS] });

describe.each(testDatabases())("probe round two on %s", database => {
	let stack: Stack;
	const statuses: number[] = [];
	const rejected = rejectionCheck(() => stack, TABLES, statuses);
	const rejectedLeavingUsers = rejectionCheck(() => stack, ["users"], statuses);
	const sign = (claims: JWTPayload) => new SignJWT(claims).setProtectedHeader({ alg: "HS256" }).sign(new TextEncoder().encode(stack.config.AUTH_JWT_SECRET));
	const now = () => Math.floor(Date.now() / 1000);

	beforeAll(async () => {
		stack = await startStack({ database, env: { WEBHOOK_ALLOW_NETS: "127.0.0.0/8", DELIVERY_RETRY_SCHEDULE: "10m,20m" } });
	});
	afterAll(() => stack?.stop());
	afterEach(() => {
		expect(statuses.filter(status => status >= 500)).toEqual([]);
	});

	describe("1. customer and user ids do not share a namespace", () => {
		it("a token whose sub is another customer's id, without a customer claim, is not that customer", async () => {
			const member = await stack.token("bob", { customer: "c2" });
			const created = await stack.request("POST", "/id/v3/webhooks", { token: member, body: hookBody("Shared name") });
			expect(created.status).toBe(201);
			const impostor = await stack.token("c2");

			const listed = await stack.request("GET", "/id/v3/webhooks", { token: impostor });
			expect(listed.status).toBe(200);
			expect(listed.body.webhooks).toEqual([]);
			const before = await snapshotTables(stack.db, ["webhooks"]);
			for (const [method, route] of [
				["GET", `/id/v3/webhooks/${created.body.id}`],
				["PATCH", `/id/v3/webhooks/${created.body.id}`],
				["POST", `/id/v3/webhooks/${created.body.id}/rotate`],
				["DELETE", `/id/v3/webhooks/${created.body.id}`],
			]) {
				const response = await stack.request(method, route, { token: impostor, body: method === "PATCH" ? { active: false } : undefined });
				expectProblem(response, 404);
			}
			expect(await snapshotTables(stack.db, ["webhooks"])).toEqual(before);

			// Each has a namespace of its own: the same name is free for the user's own customer.
			const own = await stack.request("POST", "/id/v3/webhooks", { token: impostor, body: hookBody("Shared name") });
			expect(own.status).toBe(201);
			const membersList = await stack.request("GET", "/id/v3/webhooks", { token: member });
			expect(membersList.body.webhooks.map((hook: { id: string }) => hook.id)).toEqual([created.body.id]);
		});

		it("an event for the user reaches the user's own webhooks, and one for the named customer does not", async () => {
			const token = await stack.token("solo", { email: "solo@example.com" });
			// Nothing listens on port 1: the one attempt fails at once, and the retry is 10 minutes away,
			// so the tables stay still for the other tests' snapshots.
			const hook = await stack.request("POST", "/id/v3/webhooks", { token, body: { name: "Solo", url: "https://127.0.0.1:1/in", events: [ORDER_STATUS] } });
			expect(hook.status).toBe(201);
			const viaUser = await stack.app.broker.call<{ deliveries: number }, object>("dispatcher.publish", { user_id: "solo", order_id: "o-solo-1", status: "fulfilled" });
			expect(viaUser.deliveries).toBe(1);
			const namedSolo = await stack.app.broker.call<{ deliveries: number }, object>("dispatcher.publish", { customer_id: "solo", user_id: "solo", order_id: "o-solo-2", status: "fulfilled" });
			expect(namedSolo.deliveries).toBe(0);
			let settled: { attempt_count: number; next_attempt_at: string | null } | undefined;
			for (let i = 0; i < 150 && !(settled && settled.attempt_count >= 1 && settled.next_attempt_at); i++) {
				await sleep(200);
				settled = await stack.db("deliveries").where({ webhook_id: hook.body.id }).first();
			}
			expect(settled).toMatchObject({ customer_id: "~solo", status: "pending", attempt_count: 1 });
		});
	});

	describe("2. an error answer writes nothing, path parameters included", () => {
		it("refreshes no user record for a malformed id in the path", async () => {
			const first = await stack.token("pathy", { name: "Old Name", email: "old@example.com" });
			expect((await stack.request("GET", "/id/v3/user/details", { token: first })).status).toBe(200);
			const renamed = await stack.token("pathy", { name: "New Name", email: "new@example.com" });
			const hook = await stack.request("POST", "/id/v3/webhooks", { token: first, body: hookBody("Pathy") });
			for (const route of [
				"/id/v3/webhooks/not-a-uuid",
				`/id/v3/webhooks/${hook.body.id}/deliveries/not-a-uuid`,
				"/id/v3/webhooks/not-a-uuid/stats",
			]) {
				// Only the users table: deliveries of the other tests change on their own meanwhile.
				await rejectedLeavingUsers("GET", route, { token: renamed }, 422);
			}
			expect(await stack.db("users").where({ user_id: "pathy" }).first()).toMatchObject({ name: "Old Name", email: "old@example.com" });
		});
	});

	describe("3. an IPv4 allowance does not open the IPv6 forms of its addresses", () => {
		it("refuses IPv4-mapped loopback at create, whatever its spelling", async () => {
			const token = await stack.token("mapper", { customer: "mapped-co" });
			for (const host of ["[::ffff:127.0.0.1]", "[0:0:0:0:0:ffff:127.0.0.1]", "[::ffff:7f00:1]"]) {
				const response = await rejected("POST", "/id/v3/webhooks", { token, body: { name: host, url: `https://${host}:8443/in`, events: [ORDER_STATUS] } }, 422);
				expect(JSON.stringify(response.body.errors)).toMatch(/url/);
			}
			// The allowance itself still works.
			expect((await stack.request("POST", "/id/v3/webhooks", { token, body: { name: "v4", url: "https://127.0.0.1:8443/in", events: [ORDER_STATUS] } })).status).toBe(201);
		});

		it("refuses a host that resolves only to ::ffff:127.0.0.1 at connect", async () => {
			const allow = parseAllowList(["127.0.0.0/8"]);
			expect(isBlockedAddress("::ffff:127.0.0.1", allow)).toBe(true);
			expect(isBlockedAddress("127.0.0.1", allow)).toBe(false);
			// An explicit IPv6 range for the mapped form opens it.
			expect(isBlockedAddress("::ffff:127.0.0.1", parseAllowList(["::ffff:127.0.0.0/104"]))).toBe(false);
			const lookup = guardedLookup(allow, (_host, _options, callback) => callback(null, [{ address: "::ffff:127.0.0.1", family: 6 }]));
			const error = await new Promise<NodeJS.ErrnoException | null>(resolve => lookup("mapped.example.com", { all: true }, failure => resolve(failure)));
			expect(error?.code).toBe("ERR_WEBHOOK_BLOCKED_ADDRESS");
			// The sender refuses the literal too, before any packet leaves.
			const sender = new WebhookSender({ allowNets: ["127.0.0.0/8"] });
			try {
				for (const host of ["[::ffff:127.0.0.1]", "[0:0:0:0:0:ffff:127.0.0.1]"]) {
					const outcome = await sender.send({ url: `https://${host}:9/in`, messageId: "msg_mapped", body: "{}", secrets: [generateWebhookSecret()], timeoutMs: 2_000 });
					expect({ host, title: outcome.title, success: outcome.success }).toEqual({ host, title: "Blocked", success: false });
				}
			} finally {
				await sender.close();
			}
		});
	});

	describe("4. bodies are valid UTF-8", () => {
		it("answers 400 to a name with invalid UTF-8 and stores nothing", async () => {
			const token = await stack.token("bytes", { customer: "bytes-co" });
			const body = Buffer.concat([Buffer.from('{"name":"bad '), Buffer.from([0xc3, 0x28]), Buffer.from(`","url":"https://bytes.example.com/in","events":["${ORDER_STATUS}"]}`)]);
			const before = await snapshotTables(stack.db, TABLES);
			const [response] = await rawExchange(
				stack.baseUrl,
				Buffer.concat([
					Buffer.from(`POST /id/v3/webhooks HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer ${token}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n`),
					body,
				]),
			);
			expect({ status: response.status, type: response.headers["content-type"] }).toEqual({ status: 400, type: "application/problem+json" });
			expect(JSON.parse(response.body).detail).toMatch(/not valid UTF-8 JSON/i);
			expect(await snapshotTables(stack.db, TABLES)).toEqual(before);
		});
	});

	describe("5. HTTP framing", () => {
		let token: string;
		beforeAll(async () => {
			token = await stack.token("framer", { customer: "framing-co" });
		});
		const body = () => JSON.stringify(hookBody(`framed ${crypto.randomBytes(3).toString("hex")}`));

		it.each(["xchunked", "gzip", "gzip, chunked"])("answers Transfer-Encoding: %s with a problem and closes the connection", async coding => {
			const before = await snapshotTables(stack.db, TABLES);
			const payload = body();
			const chunked = `${payload.length.toString(16)}\r\n${payload}\r\n0\r\n\r\n`;
			const responses = await rawExchange(
				stack.baseUrl,
				`POST /id/v3/webhooks HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer ${token}\r\nContent-Type: application/json\r\nTransfer-Encoding: ${coding}\r\n\r\n${chunked}`,
			);
			expect(responses.map(response => response.status)).toEqual([400]);
			expect(responses[0].headers).toMatchObject({ "content-type": "application/problem+json", "x-content-type-options": "nosniff", "cache-control": "no-store", connection: "close" });
			expect(responses[0].headers["x-request-id"]).toEqual(expect.any(String));
			expect(JSON.parse(responses[0].body)).toMatchObject({ status: 400, detail: expect.stringMatching(/Transfer-Encoding/) });
			expect(await snapshotTables(stack.db, TABLES)).toEqual(before);
		});

		it("answers HTTP/1.1 without Host with a problem and the usual headers", async () => {
			const responses = await rawExchange(stack.baseUrl, `GET /id/v3/webhooks HTTP/1.1\r\nAuthorization: Bearer ${token}\r\n\r\n`);
			expect(responses.map(response => response.status)).toEqual([400]);
			expect(responses[0].headers).toMatchObject({ "content-type": "application/problem+json", "x-content-type-options": "nosniff", "cache-control": "no-store" });
			expect(JSON.parse(responses[0].body)).toMatchObject({ status: 400, detail: expect.stringMatching(/Host/) });
		});

		it("refuses two Authorization headers, whichever comes first, and writes nothing", async () => {
			const other = await stack.token("framer-two", { customer: "framing-other" });
			const before = await snapshotTables(stack.db, TABLES);
			const payload = body();
			for (const [first, second] of [
				[token, other],
				[other, token],
			]) {
				const responses = await rawExchange(
					stack.baseUrl,
					`POST /id/v3/webhooks HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer ${first}\r\nAuthorization: Bearer ${second}\r\nContent-Type: application/json\r\nContent-Length: ${payload.length}\r\nConnection: close\r\n\r\n${payload}`,
				);
				expect(responses.map(response => [response.status, response.headers["content-type"]])).toEqual([[400, "application/problem+json"]]);
				expect(JSON.parse(responses[0].body).detail).toMatch(/Authorization/);
			}
			expect(await snapshotTables(stack.db, TABLES)).toEqual(before);
		});
	});

	describe("6. tokens expire within a bound", () => {
		it("refuses exp beyond AUTH_MAX_TOKEN_AGE and non-finite time claims, recording no user", async () => {
			const cases: Array<[string, string]> = [
				["exp 1e20", `{"sub":"forever","iat":${now()},"exp":1e20}`],
				["exp 1e309", `{"sub":"forever","iat":${now()},"exp":1e309}`],
				["exp two days out", `{"sub":"forever","iat":${now()},"exp":${now() + 2 * 86_400}}`],
				["exp two days out, no iat", `{"sub":"forever","exp":${now() + 2 * 86_400}}`],
				["iat -1e309", `{"sub":"forever","iat":-1e309,"exp":${now() + 60}}`],
				["nbf -1e309", `{"sub":"forever","nbf":-1e309,"iat":${now()},"exp":${now() + 60}}`],
				["auth_time -1e309", `{"sub":"forever","auth_time":-1e309,"iat":${now()},"exp":${now() + 60}}`],
			];
			for (const [label, payload] of cases) {
				const token = await signRaw(payload, stack.config.AUTH_JWT_SECRET!);
				const response = await rejected("GET", "/id/v3/user/details", { headers: { authorization: `Bearer ${token}` } }, 401);
				expect({ label, detail: response.body.detail }).toEqual({ label, detail: expect.stringMatching(/^Token/) });
			}
			expect(await stack.db("users").where({ user_id: "forever" })).toEqual([]);
			// Within the bound is fine.
			const fine = await sign({ sub: "bounded", iat: now(), exp: now() + 23 * 3600 });
			expect((await stack.request("GET", "/id/v3/user/details", { headers: { authorization: `Bearer ${fine}` } })).status).toBe(200);
		});
	});

	describe("9. smaller points", () => {
		it("refuses repeated keys in a JSON body, naming the key", async () => {
			const token = await stack.token("dupe", { customer: "dupe-co" });
			const response = await rejected(
				"POST",
				"/id/v3/webhooks",
				{ token, headers: { "content-type": "application/json" }, body: `{"name":"one","name":"two","url":"https://dupe.example.com/in","events":["${ORDER_STATUS}"]}` },
				400,
			);
			expect(response.body.detail).toMatch(/"name"/);
			await rejected(
				"PUT",
				"/id/v3/user/settings",
				{ token, headers: { "content-type": "application/json" }, body: `{"notifications":[{"category":"tasking","settings":[{"topic":"${ORDER_STATUS}","email":true,"email":false}]}]}` },
				400,
			);
			// The same key in two different objects is fine.
			const fine = await stack.request("POST", "/id/v3/webhooks", { token, headers: { "content-type": "application/json" }, body: JSON.stringify({ name: "x", url: "https://dupe.example.com/in", events: [ORDER_STATUS], headers: { name: "v" } }) });
			expect(fine.status).toBe(201);
		});

		it("treats look-alike names as one name: no-break space, full-width letters", async () => {
			const token = await stack.token("alike", { customer: "alike-co" });
			expect((await stack.request("POST", "/id/v3/webhooks", { token, body: hookBody("Orders ERP") })).status).toBe(201);
			for (const name of ["Orders\u00a0ERP", "Ｏｒｄｅｒｓ ERP", "Orders  ERP", "Orders\u2003ERP"]) {
				const response = await rejected("POST", "/id/v3/webhooks", { token, body: hookBody(name) }, 409);
				expect(response.body.detail).toMatch(/name/);
			}
		});

		it("refuses Cookie, Forwarded and X-Forwarded-For as custom header names", async () => {
			const token = await stack.token("proxy", { customer: "proxy-co" });
			for (const header of ["Cookie", "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-IP", "Via", "Set-Cookie"]) {
				const response = await rejected("POST", "/id/v3/webhooks", { token, body: { ...hookBody(`h ${header}`), headers: { [header]: "x" } } }, 422);
				expect(JSON.stringify(response.body.errors)).toContain(header);
			}
		});
	});
});

/** Signs a payload given as JSON text, so that it can hold numbers JavaScript cannot (1e309). */
async function signRaw(payloadJson: string, secret: string): Promise<string> {
	const encode = (text: string) => Buffer.from(text).toString("base64url");
	const input = `${encode(JSON.stringify({ alg: "HS256", typ: "JWT" }))}.${encode(payloadJson)}`;
	return `${input}.${crypto.createHmac("sha256", secret).update(input).digest("base64url")}`;
}

describe.each(testDatabases())("a deployment that requires the customer claim, on %s", database => {
	let stack: Stack;
	beforeAll(async () => {
		stack = await startStack({ database, services: ["api", "topics", "webhooks", "users"], env: { AUTH_REQUIRE_CUSTOMER_CLAIM: "true" } });
	});
	afterAll(() => stack?.stop());

	it("answers 401 to a token without it and records no user", async () => {
		const response = await stack.request("GET", "/id/v3/webhooks", { token: await stack.token("lonely") });
		expectProblem(response, 401);
		expect(response.body.detail).toMatch(/customer_id/);
		expect(await stack.db("users").where({ user_id: "lonely" })).toEqual([]);
		expect((await stack.request("GET", "/id/v3/webhooks", { token: await stack.token("member", { customer: "acme" }) })).status).toBe(200);
	});
});

describe.each(testDatabases())("the rate limit per customer, on %s", database => {
	let stack: Stack;
	beforeAll(async () => {
		stack = await startStack({ database, services: ["api", "topics", "webhooks"], env: { RATE_LIMIT_PER_MINUTE: "3" } });
	});
	afterAll(() => stack?.stop());

	it("counts every user of one customer against one budget, and other customers apart", async () => {
		const answers: number[] = [];
		for (const user of ["ann", "ben", "cat", "dan"]) answers.push((await stack.request("GET", "/id/v3/webhooks", { token: await stack.token(user, { customer: "busy-co" }) })).status);
		expect(answers).toEqual([200, 200, 200, 429]);
		expect((await stack.request("GET", "/id/v3/webhooks", { token: await stack.token("ann", { customer: "quiet-co" }) })).status).toBe(200);
	});
});

describe.each(testDatabases())("customer ids of users without a customer claim, moved by migration, on %s", database => {
	let db: Knex;
	let stack: Stack | undefined;
	let scratch: ScratchDatabase | undefined;

	beforeAll(async () => {
		scratch = await scratchDatabase(database, "namespace");
		db = scratch.db;
	});
	afterAll(async () => {
		await stack?.stop();
		await scratch?.drop();
	});

	it("keeps the webhooks and deliveries of implicit and named customers with their owners", async () => {
		// The tables as they were before the namespaces: implicit customers named by the user id.
		await runMigrations(db, "users", usersMigrations.slice(0, 1));
		await runMigrations(db, "webhooks", webhooksMigrations.filter(migration => migration.name < "005"));
		await runMigrations(db, "dispatcher", dispatcherMigrations.filter(migration => migration.name < "007"));
		// Recent: a failed delivery older than RETENTION_PERIOD (30 days) is the prune's to delete, and
		// the dispatcher's first prune comes at a random moment of its first minute. Dated in January,
		// the delivery was gone before the test read it in a CI run, on both engines.
		const at = new Date().toISOString();
		const user = (userId: string, customerId: string) => ({ user_id: userId, customer_id: customerId, name: null, email: null, last_login: null, created_at: at, updated_at: at });
		await db("users").insert([
			user("alice", "alice"), // implicit: her own customer
			user("bob", "acme"), // a member of the named customer acme
			user("dave", "dave"), // implicit, but…
			user("erin", "dave"), // …erin's token names a customer "dave": the named customer keeps "dave"
		]);
		const ids = { alice: crypto.randomUUID(), acme: crypto.randomUUID(), dave: crypto.randomUUID() };
		const hook = (id: string, customerId: string) => ({ id, customer_id: customerId, name: `hook of ${customerId}`, url: `https://${customerId}.example.com/`, events: JSON.stringify([ORDER_STATUS]), active: true, secret_envelope: "x", created_at: at, updated_at: at });
		await db("webhooks").insert([hook(ids.alice, "alice"), hook(ids.acme, "acme"), hook(ids.dave, "dave")]);
		// Names stored before look-alikes were one name: brought to the comparable form, unless a twin has it.
		const named = (id: string, name: string) => ({ ...hook(id, "names-co"), name, url: `https://${id}.example.com/` });
		await db("webhooks").insert([named("full-width", "Ｆｕｌｌ width"), named("twin-nbsp", "Twin\u00a0name"), named("twin-plain", "Twin name")]);
		const eventId = crypto.randomUUID();
		await db("delivery_messages").insert({ event_id: eventId, customer_id: "alice", user_id: "alice", type: ORDER_STATUS, body: "{}", occurred_at: at, created_at: at });
		const deliveryId = crypto.randomUUID();
		await db("deliveries").insert({ id: deliveryId, event_id: eventId, webhook_id: ids.alice, customer_id: "alice", status: "failed", next_attempt_at: null, created_at: at, updated_at: at });

		stack = await startStack({ database, dataDir: scratch!.dataDir, schema: scratch!.schema, services: ["api", "topics", "webhooks", "users", "dispatcher"] });
		const listOf = async (token: string) => (await stack!.request("GET", "/id/v3/webhooks", { token })).body.webhooks.map((entry: { id: string }) => entry.id);
		expect(await listOf(await stack.token("alice"))).toEqual([ids.alice]);
		expect(await listOf(await stack.token("bob", { customer: "acme" }))).toEqual([ids.acme]);
		expect(await listOf(await stack.token("erin", { customer: "dave" }))).toEqual([ids.dave]);
		expect(await listOf(await stack.token("dave"))).toEqual([]);
		const delivery = await stack.request("GET", `/id/v3/webhooks/${ids.alice}/deliveries/${deliveryId}`, { token: await stack.token("alice") });
		expect(delivery.status).toBe(200);
		expect(await db("users").where({ user_id: "alice" }).first()).toMatchObject({ customer_id: "~alice" });
		expect(await db("users").where({ user_id: "bob" }).first()).toMatchObject({ customer_id: "acme" });
		const names = Object.fromEntries((await db("webhooks").whereIn("id", ["full-width", "twin-nbsp", "twin-plain"]).select("id", "name")).map((row: { id: string; name: string }) => [row.id, row.name]));
		expect(names).toEqual({ "full-width": "Full width", "twin-nbsp": "Twin\u00a0name", "twin-plain": "Twin name" });
	});
});

describe("slow clients", () => {
	let stack: Stack;
	beforeAll(async () => {
		stack = await startStack({ services: ["api", "topics"], env: { HTTP_HEADERS_TIMEOUT: "1s", HTTP_REQUEST_TIMEOUT: "2s", HTTP_CONNECTIONS_PER_ADDRESS: "4" } });
	});
	afterAll(() => stack?.stop());

	it("answers 408 and closes a connection whose headers trickle in past HTTP_HEADERS_TIMEOUT", async () => {
		const { port } = new URL(stack.baseUrl);
		const socket = net.connect({ host: "127.0.0.1", port: Number(port) });
		socket.on("error", () => undefined);
		const chunks: Buffer[] = [];
		socket.on("data", chunk => chunks.push(chunk));
		const closed = new Promise<void>(resolve => socket.on("close", () => resolve()));
		socket.write("GET /id/v3/webhooks/events HTTP/1.1\r\nHost: localhost\r\n");
		// One header line every 200 ms: each keeps the socket busy, none completes the request.
		const trickle = setInterval(() => socket.writable && socket.write(`X-Slow-${Date.now()}: 1\r\n`), 200);
		const stuck = setTimeout(() => socket.destroy(new Error("the server kept the connection open")), 15_000);
		await closed;
		clearInterval(trickle);
		clearTimeout(stuck);
		const responses = parseRawResponses(Buffer.concat(chunks).toString("utf8"));
		expect(responses.map(response => [response.status, response.headers["content-type"]])).toEqual([[408, "application/problem+json"]]);
	});

	it("refuses connections past HTTP_CONNECTIONS_PER_ADDRESS from one address, and takes them again once some close", async () => {
		const { port } = new URL(stack.baseUrl);
		const open = (): Promise<{ socket: net.Socket; answer: Promise<string> }> =>
			new Promise((resolve, reject) => {
				const socket = net.connect({ host: "127.0.0.1", port: Number(port) }, () => {
					const chunks: Buffer[] = [];
					socket.on("data", chunk => chunks.push(chunk));
					resolve({ socket, answer: new Promise(done => socket.on("close", () => done(Buffer.concat(chunks).toString("utf8")))) });
				});
				socket.setTimeout(15_000, () => socket.destroy());
				socket.on("error", reject);
			});
		const held = [await open(), await open(), await open(), await open()];
		const refused = await open();
		const [answer] = parseRawResponses(await refused.answer);
		expect({ status: answer?.status, type: answer?.headers["content-type"] }).toEqual({ status: 429, type: "application/problem+json" });
		for (const { socket } of held) socket.destroy();
		await Promise.all(held.map(({ answer: closed }) => closed));
		const fresh = await rawExchange(stack.baseUrl, "GET /id/v3/webhooks/events HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
		expect(fresh.map(response => response.status)).toEqual([401]);
	});
});

describe("repeated JSON keys (lib/json-body.ts)", () => {
	it("finds a key repeated in one object, at any depth, compared as decoded text", () => {
		expect(repeatedKey('{"a":1,"a":2}')).toBe("a");
		expect(repeatedKey('{"a":1,"\\u0061":2}')).toBe("a");
		expect(repeatedKey('{"x":[{"b":1},{"b":2,"c":{"d":1,"d":2}}]}')).toBe("d");
		expect(repeatedKey('{"s":"{\\"a\\":1,\\"a\\":2}"}')).toBeUndefined();
	});

	it("lets the same key in different objects, and values equal to keys, through", () => {
		expect(repeatedKey('{"a":{"a":"a"},"b":[{"a":1},{"a":2}]}')).toBeUndefined();
		expect(repeatedKey('["a","a"]')).toBeUndefined();
		expect(repeatedKey('{"a":"b","b":"a"}')).toBeUndefined();
	});
});
