// Custom request headers per webhook, through the real gateway and a real HTTPS receiver: sent
// with every delivery and with the test request, refused with 422 naming the header, never
// returned, logged or stored in clear. On SQLite and PostgreSQL.
import crypto from "node:crypto";
import { Writable } from "node:stream";
import { testDatabases } from "./helpers/services";
import { newCustomer, startDeliveryStack, waitUntil, type DeliveryStack } from "./helpers/delivery-stack";
import { expectProblem, snapshotTables } from "./helpers/stack";

const SECRET_VALUE = `Bearer tok-${crypto.randomBytes(12).toString("hex")}`;
const OTHER_VALUE = `k-${crypto.randomBytes(12).toString("hex")}`;

describe.each(testDatabases())("custom webhook headers on %s", database => {
	let env: DeliveryStack;
	let logged = "";

	const create = (token: string, body: Record<string, unknown>) =>
		env.stack.request("POST", "/id/v3/webhooks", {
			token,
			body: { name: `h-${crypto.randomBytes(4).toString("hex")}`, url: `${env.receiver.url}/h/${crypto.randomBytes(4).toString("hex")}`, events: ["tasking:order_status"], ...body },
		});

	beforeAll(async () => {
		env = await startDeliveryStack(database, { env: { LOG_LEVEL: "debug" } });
		// Capture everything the services log, at debug level, to look for the values later.
		const sink = new Writable({
			write(chunk, _encoding, done) {
				logged += String(chunk);
				done();
			},
		});
		const broker = env.stack.app.broker;
		const original = broker.logger;
		for (const level of ["fatal", "error", "warn", "info", "debug", "trace"] as const) {
			const write = original[level].bind(original);
			original[level] = (...args: unknown[]) => {
				sink.write(args.map(arg => (typeof arg === "string" ? arg : JSON.stringify(arg))).join(" ") + "\n");
				write(...args);
			};
		}
		for (const service of broker.services) {
			for (const level of ["fatal", "error", "warn", "info", "debug", "trace"] as const) {
				const write = service.logger[level].bind(service.logger);
				service.logger[level] = (...args: unknown[]) => {
					sink.write(args.map(arg => (arg instanceof Error ? `${arg.message} ${arg.stack}` : typeof arg === "string" ? arg : JSON.stringify(arg))).join(" ") + "\n");
					write(...args);
				};
			}
		}
	});
	afterAll(() => env?.stop());

	it("sends the configured headers with every delivery and the test request, and shows only their names", async () => {
		const alice = await newCustomer(env.stack);
		const created = await create(alice.token, { headers: { Authorization: SECRET_VALUE, "X-Api-Key": OTHER_VALUE } });
		expect(created.status).toBe(201);
		expect(created.body.header_names).toEqual(["Authorization", "X-Api-Key"]);
		expect(created.text).not.toContain(SECRET_VALUE);
		const webhook = { id: created.body.id, url: created.body.url, path: new URL(created.body.url).pathname, secret: created.body.secret };

		await env.stack.app.broker.call("dispatcher.publish", { customer_id: alice.id, user_id: alice.userId, order_id: "o-1", status: "fulfilled" });
		const [delivered] = await waitUntil(() => env.received(webhook), requests => requests.length >= 1, "the delivery");
		expect(delivered.headers.authorization).toBe(SECRET_VALUE);
		expect(delivered.headers["x-api-key"]).toBe(OTHER_VALUE);
		// Ours are untouched.
		expect(delivered.headers["content-type"]).toBe("application/json");
		expect(String(delivered.headers["webhook-id"])).toMatch(/^msg_/);

		const tested = await env.stack.request("POST", `/id/v3/webhooks/${webhook.id}/test`, { token: alice.token });
		expect(tested.body).toMatchObject({ success: true, header_names: ["Authorization", "X-Api-Key"] });
		const testRequest = env.received(webhook).at(-1)!;
		expect(testRequest.headers.authorization).toBe(SECRET_VALUE);

		// PATCH replaces the set; {} (or null) removes every header.
		const replaced = await env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice.token, body: { headers: { "X-Tenant": "acme" } } });
		expect(replaced.body.header_names).toEqual(["X-Tenant"]);
		await env.stack.request("POST", `/id/v3/webhooks/${webhook.id}/test`, { token: alice.token });
		const afterReplace = env.received(webhook).at(-1)!;
		expect(afterReplace.headers["x-tenant"]).toBe("acme");
		expect(afterReplace.headers.authorization).toBeUndefined();
		const cleared = await env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice.token, body: { headers: null } });
		expect(cleared.body.header_names).toEqual([]);
		expect((await env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice.token, body: { headers: { A: "1" } } })).body.header_names).toEqual(["A"]);
		expect((await env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice.token, body: { headers: {} } })).body.header_names).toEqual([]);

		// A PATCH of another field leaves the headers alone.
		const again = await env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice.token, body: { headers: { Authorization: SECRET_VALUE } } });
		const renamed = await env.stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice.token, body: { name: "renamed" } });
		expect(renamed.body.header_names).toEqual(["Authorization"]);
		for (const response of [again, renamed, await env.stack.request("GET", `/id/v3/webhooks/${webhook.id}`, { token: alice.token }), await env.stack.request("GET", "/id/v3/webhooks", { token: alice.token })]) {
			expect(response.text).not.toContain(SECRET_VALUE);
		}
	});

	it("never stores or logs a value in clear", async () => {
		const alice = await newCustomer(env.stack);
		const created = await create(alice.token, { headers: { Authorization: SECRET_VALUE, "X-Api-Key": OTHER_VALUE } });
		expect(created.status).toBe(201);
		await env.stack.request("POST", `/id/v3/webhooks/${created.body.id}/test`, { token: alice.token });
		const rows = await env.stack.db("webhooks").where({ id: created.body.id });
		expect(rows).toHaveLength(1);
		const dump = JSON.stringify(rows);
		expect(dump).not.toContain(SECRET_VALUE);
		expect(dump).not.toContain(OTHER_VALUE);
		expect(dump).not.toContain(Buffer.from(SECRET_VALUE).toString("base64"));
		expect(rows[0].headers_envelope).toMatch(/^v1:/);
		// The envelope is bound to its row: copied onto another webhook it does not decrypt.
		const other = await create(alice.token, {});
		await env.stack.db("webhooks").where({ id: other.body.id }).update({ headers_envelope: rows[0].headers_envelope, header_names: rows[0].header_names });
		await expect(env.stack.app.broker.call("webhooks.resolve", { ids: [other.body.id] })).rejects.toThrow(/do not decrypt/);
		await env.stack.db("webhooks").where({ id: other.body.id }).update({ headers_envelope: null, header_names: "[]" });
		expect(logged.length).toBeGreaterThan(0);
		expect(logged).not.toContain(SECRET_VALUE);
		expect(logged).not.toContain(OTHER_VALUE);
	});

	it("refuses reserved, hop-by-hop and malformed names, bad values and too many headers with 422 naming the header, writing nothing", async () => {
		const alice = await newCustomer(env.stack);
		const existing = await create(alice.token, { headers: { "X-Keep": "yes" } });
		const before = await snapshotTables(env.stack.db, ["webhooks"]);
		const tooMany = Object.fromEntries(Array.from({ length: 21 }, (_, i) => [`X-H${i}`, "v"]));
		const cases: Array<[Record<string, unknown>, string]> = [
			[{ "webhook-signature": "v1,forged" }, "webhook-signature"],
			[{ "Webhook-Id": "msg_x" }, "Webhook-Id"],
			[{ "Content-Type": "text/plain" }, "Content-Type"],
			[{ "content-length": "5" }, "content-length"],
			[{ Host: "evil.example" }, "Host"],
			[{ "User-Agent": "me" }, "User-Agent"],
			[{ Connection: "close" }, "Connection"],
			[{ "Transfer-Encoding": "chunked" }, "Transfer-Encoding"],
			[{ "Keep-Alive": "5" }, "Keep-Alive"],
			[{ Upgrade: "h2c" }, "Upgrade"],
			[{ TE: "trailers" }, "TE"],
			[{ "Proxy-Authorization": "x" }, "Proxy-Authorization"],
			[{ "Bad Name": "v" }, "Bad Name"],
			[{ "X-Ok:": "v" }, "X-Ok:"],
			[{ "": "v" }, ""],
			[{ "X-Inject": "a\r\nX-Evil: 1" }, "X-Inject"],
			[{ "X-Lf": "a\nb" }, "X-Lf"],
			[{ "X-Nul": "a\u0000b" }, "X-Nul"],
			[{ "X-Big": "v".repeat(1025) }, "X-Big"],
			[{ "X-Number": 5 }, "X-Number"],
			[{ "X-Null": null }, "X-Null"],
			[{ "X-Obj": { a: 1 } }, "X-Obj"],
			[{ "X-Dup": "1", "x-dup": "2" }, "x-dup"],
			[{ "X-Emoji": "😀" }, "X-Emoji"],
		];
		for (const [headers, name] of cases) {
			for (const response of [
				await create(alice.token, { headers }),
				await env.stack.request("PATCH", `/id/v3/webhooks/${existing.body.id}`, { token: alice.token, body: { headers } }),
			]) {
				expectProblem(response, 422);
				expect([name, response.body.errors.some((error: { path: string; message: string }) => error.path === `headers.${name}` && error.message.includes(`"${name}"`))]).toEqual([name, true]);
				expect(response.text).not.toContain("forged");
			}
		}
		for (const headers of [tooMany, ["X-A", "b"], "X-A: b", 5]) {
			expectProblem(await create(alice.token, { headers }), 422);
		}
		// The limits themselves are fine: 20 headers, a value of exactly 1 KiB.
		const twenty = Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`X-H${i}`, i === 0 ? "v".repeat(1024) : "v"]));
		const atLimit = await create(alice.token, { headers: twenty });
		expect(atLimit.status).toBe(201);
		await env.stack.request("DELETE", `/id/v3/webhooks/${atLimit.body.id}`, { token: alice.token });
		expect(await snapshotTables(env.stack.db, ["webhooks"])).toEqual(before);
	});
});
