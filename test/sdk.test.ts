// The TypeScript SDK (sdk/) against the real gateway and dispatcher: every method, the page
// iterator, typed errors with their problem details, the bounded wait on 429, and verifyWebhook
// on real deliveries (including a rotation's grace period), plus the SDK examples of docs/api.md and docs/delivery.md run
// as written. The SDK is an HTTP client, so one database engine is enough here.
import { spawn, type ChildProcess } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { Webhook } from "standardwebhooks";
import {
	ApiError,
	AuthenticationError,
	ConflictError,
	EVENT_DATA_SCHEMAS,
	ForbiddenError,
	NotFoundError,
	PreconditionFailedError,
	RateLimitError,
	SatelliteWebhooksClient,
	ServiceUnavailableError,
	ValidationError,
	WebhookVerificationError,
	verifyWebhook,
	type UpdateWebhookInput,
	type WebhookEvent,
	type WebhookWithSecret,
} from "@satellite-webhooks/sdk";
import { startStack, type Stack } from "./helpers/stack";
import { sleep, startDeliveryStack, waitUntil, type CreatedWebhook, type DeliveryStack, type OrderEvent } from "./helpers/delivery-stack";
import type { ReceivedRequest } from "./helpers/https-receiver";
import { freePort } from "./helpers/net";
import { generateEventSchemas, generateTypes, SCHEMAS_TARGET as GENERATED_SCHEMAS, TARGET as GENERATED_TYPES } from "../sdk/scripts/generate-types";
import type { ServiceSchema } from "moleculer";
import DispatcherService from "../services/dispatcher.service";

const ROOT = path.resolve(__dirname, "..");

describe("the SDK package", () => {
	it("has its types and event schemas generated from the current schemas (run `npm run generate -w @satellite-webhooks/sdk` if not)", () => {
		expect(fs.readFileSync(GENERATED_TYPES, "utf8")).toBe(generateTypes());
		expect(fs.readFileSync(GENERATED_SCHEMAS, "utf8")).toBe(generateEventSchemas());
	});

	it("builds into a self-contained dist/: nothing imported from the service, only its declared dependencies at run time", async () => {
		// Inside the repository, so that the build finds standardwebhooks as a customer's install would.
		const outDir = fs.mkdtempSync(path.join(ROOT, "sdk", ".dist-check-"));
		try {
			const tsc = spawn(path.join(ROOT, "node_modules", ".bin", "tsc"), ["-p", "sdk/tsconfig.build.json", "--outDir", outDir], { cwd: ROOT });
			let output = "";
			tsc.stdout.on("data", chunk => (output += chunk));
			tsc.stderr.on("data", chunk => (output += chunk));
			expect({ code: await new Promise(resolve => tsc.on("exit", resolve)), output }).toEqual({ code: 0, output: "" });
			const files = fs.readdirSync(outDir).filter(name => /\.(js|d\.ts)$/.test(name));
			expect(files.sort()).toEqual([
				"api-types.d.ts",
				"api-types.js",
				"client.d.ts",
				"client.js",
				"errors.d.ts",
				"errors.js",
				"event-schemas.d.ts",
				"event-schemas.js",
				"index.d.ts",
				"index.js",
				"verify.d.ts",
				"verify.js",
			]);
			const declared = Object.keys(JSON.parse(fs.readFileSync(path.join(ROOT, "sdk", "package.json"), "utf8")).dependencies);
			expect(declared.sort()).toEqual(["ajv", "ajv-formats", "standardwebhooks"]);
			for (const file of files) {
				const text = fs.readFileSync(path.join(outDir, file), "utf8");
				const imported = [...text.matchAll(/(?:require\(|from )"([^"]+)"/g)].map(match => match[1]);
				const outside = imported.filter(name => !name.startsWith("./") && !declared.some(dependency => name === dependency || name.startsWith(`${dependency}/`)));
				expect({ file, outside }).toEqual({ file, outside: [] });
			}
			const built = await import(path.join(outDir, "index.js"));
			expect(typeof built.SatelliteWebhooksClient).toBe("function");
			const secret = `whsec_${crypto.randomBytes(32).toString("base64")}`;
			const body = JSON.stringify({ type: "webhook:test", timestamp: new Date().toISOString(), data: { webhook_id: "w", webhook_name: "n", message: "m" } });
			const now = new Date();
			const headers = { "webhook-id": "msg_1", "webhook-timestamp": String(Math.floor(now.getTime() / 1000)), "webhook-signature": new Webhook(secret).sign("msg_1", now, body) };
			expect(built.verifyWebhook(body, headers, secret).type).toBe("webhook:test");
			expect(built.verifyWebhook(body, headers, secret, { validate: true }).data.webhook_name).toBe("n");
		} finally {
			fs.rmSync(outDir, { recursive: true, force: true });
		}
	});
});

describe("SDK against the real gateway", () => {
	let env: DeliveryStack;
	let client: SatelliteWebhooksClient;
	let token: string;
	const customer = `cust-${crypto.randomBytes(4).toString("hex")}`;
	const user = `user-${customer}`;

	const publish = async (status = "fulfilled") => {
		const event: OrderEvent = { event_id: crypto.randomUUID(), customer_id: customer, user_id: user, order_id: `o-${crypto.randomBytes(3).toString("hex")}`, status };
		await env.stack.app.broker.call("dispatcher.publish", event);
		return event;
	};
	const webhookOf = (created: { id: string; secret: string; url: string }): CreatedWebhook => ({ ...created, path: new URL(created.url).pathname });
	const deliveriesTo = (webhook: CreatedWebhook, count: number) => waitUntil(() => env.received(webhook), requests => requests.length >= count, `${count} deliveries`);
	const newWebhook = (name: string) => client.webhooks.create({ name, url: `${env.receiver.url}/sdk/${crypto.randomBytes(4).toString("hex")}`, events: ["tasking:order_status"] });

	beforeAll(async () => {
		env = await startDeliveryStack("sqlite");
		token = await env.stack.token(user, { customer, email: `${user}@example.com` });
		client = new SatelliteWebhooksClient({ baseUrl: env.stack.baseUrl, token });
	});
	afterAll(() => env?.stop());

	it("topics.list: the catalogue", async () => {
		expect(await client.topics.list()).toEqual([
			{ topic: "tasking:order_status", name: "Tasking order status updates", description: expect.any(String), schema: EVENT_DATA_SCHEMAS["tasking:order_status"] },
			{ topic: "webhook:disabled", name: "Webhook disabled", description: expect.any(String), schema: EVENT_DATA_SCHEMAS["webhook:disabled"] },
		]);
	});

	it("webhooks.create / get / update / delete", async () => {
		const created = await newWebhook("crud");
		expect(created).toMatchObject({ id: expect.any(String), name: "crud", active: true, events: ["tasking:order_status"], secret: expect.stringMatching(/^whsec_/) });
		expect(await client.webhooks.get(created.id)).toEqual({
			id: created.id,
			name: "crud",
			url: created.url,
			events: created.events,
			active: true,
			disabled_reason: null,
			disabled_at: null,
			header_names: [],
			ordering: "per_order",
			rate_limit: null,
			created_at: created.created_at,
			updated_at: created.updated_at,
		});
		const updated = await client.webhooks.update(created.id, { name: "crud (paused)", active: false });
		expect(updated).toMatchObject({ id: created.id, name: "crud (paused)", active: false });
		expect(updated).not.toHaveProperty("secret");
		await expect(client.webhooks.delete(created.id)).resolves.toBeUndefined();
		await expect(client.webhooks.get(created.id)).rejects.toBeInstanceOf(NotFoundError);
	});

	it("webhooks.create / update carry ordering, typed as per_order or none", async () => {
		const unordered: WebhookWithSecret = await client.webhooks.create({ name: "no order kept", url: `${env.receiver.url}/sdk/unordered`, events: ["tasking:order_status"], ordering: "none" });
		const ordering: "per_order" | "none" = unordered.ordering;
		expect(ordering).toBe("none");
		const input: UpdateWebhookInput = { ordering: "per_order" };
		expect(await client.webhooks.update(unordered.id, input)).toMatchObject({ id: unordered.id, ordering: "per_order" });
		expect((await client.webhooks.get(unordered.id)).ordering).toBe("per_order");
		// A value the types would refuse is refused by the service too, at its field.
		const untyped = { ordering: "PER_ORDER" } as unknown as UpdateWebhookInput;
		await expect(client.webhooks.update(unordered.id, untyped)).rejects.toMatchObject({ status: 422, errors: [{ path: "ordering", message: expect.stringContaining("per_order") }] });
		expect((await client.webhooks.get(unordered.id)).ordering).toBe("per_order");
	});

	it("webhooks.create / update carry rate_limit, typed as a number or null", async () => {
		const limited: WebhookWithSecret = await client.webhooks.create({ name: "ten a second", url: `${env.receiver.url}/sdk/limited`, events: ["tasking:order_status"], rate_limit: 10 });
		const limit: number | null = limited.rate_limit;
		expect(limit).toBe(10);
		const input: UpdateWebhookInput = { rate_limit: null };
		expect(await client.webhooks.update(limited.id, input)).toMatchObject({ id: limited.id, rate_limit: null });
		expect((await client.webhooks.get(limited.id)).rate_limit).toBeNull();
		// Typed as a number, but not every number is a limit: the service refuses it at its field.
		await expect(client.webhooks.update(limited.id, { rate_limit: 0.5 })).rejects.toMatchObject({ status: 422, errors: [{ path: "rate_limit", message: expect.stringContaining("1 to 10000") }] });
		const untyped = { rate_limit: "10" } as unknown as UpdateWebhookInput;
		await expect(client.webhooks.update(limited.id, untyped)).rejects.toMatchObject({ status: 422, errors: [{ path: "rate_limit", message: expect.stringContaining("1 to 10000") }] });
		expect((await client.webhooks.get(limited.id)).rate_limit).toBeNull();
	});

	it("webhooks.list: the iterator walks every page in order, and stops on an exact-multiple last page", async () => {
		const other = new SatelliteWebhooksClient({ baseUrl: `${env.stack.baseUrl}/id/v3/`, token: await env.stack.token(`lister-${customer}`) });
		const names: string[] = [];
		for (let i = 0; i < 4; i++) {
			const name = `listed ${i}`;
			await other.webhooks.create({ name, url: `${env.receiver.url}/list/${customer}/${i}`, events: ["tasking:order_status"] });
			names.push(name);
		}
		const seen: string[] = [];
		for await (const webhook of other.webhooks.list({ perPage: 2 })) seen.push(webhook.name);
		expect(seen).toEqual(names);
		const pages = [];
		for await (const page of other.webhooks.list({ perPage: 2 }).pages()) pages.push(page);
		expect(pages.map(page => page.items.length)).toEqual([2, 2]);
		expect(pages[1].links).toEqual([]);
		expect(pages[0].context).toEqual({ per_page: 2, matched: 4, returned: 2 });
		expect((await other.webhooks.list({ perPage: 3 }).toArray()).map(webhook => webhook.name)).toEqual(names);
	});

	it("webhooks.test: a signed webhook:test event that verifyWebhook accepts", async () => {
		const created = await newWebhook("tested");
		const result = await client.webhooks.test(created.id);
		expect(result).toMatchObject({ id: created.id, success: true, status_code: 200, title: null });
		const [received] = env.received(webhookOf(created));
		const event = verifyWebhook(received.body, received.headers, created.secret);
		expect(event.type).toBe("webhook:test");
		if (event.type === "webhook:test") expect(event.data.webhook_id).toBe(created.id);
	});

	describe("deliveries and verifyWebhook on real deliveries", () => {
		let created: CreatedWebhook;
		let delivered: ReceivedRequest;
		let order: OrderEvent;

		beforeAll(async () => {
			created = webhookOf(await newWebhook("deliveries"));
			order = await publish();
			[delivered] = await deliveriesTo(created, 1);
		});

		it("verifyWebhook accepts a real delivery from the dispatcher, typed by its type", () => {
			const event: WebhookEvent = verifyWebhook(Buffer.from(delivered.body), delivered.headers, created.secret);
			if (event.type !== "tasking:order_status") throw new Error(`unexpected type ${event.type}`);
			expect(event.data).toMatchObject({ order_id: order.order_id, status: "fulfilled", user_id: user, previous_status: null });
			// A fetch Headers object works as well as node's header bag.
			expect(verifyWebhook(delivered.body, new Headers(delivered.headers as Record<string, string>), [created.secret]).type).toBe("tasking:order_status");
		});

		it("verifyWebhook rejects a tampered body, a wrong secret, missing headers and a stale timestamp", () => {
			const tampered = delivered.body.replace(order.order_id, "o-forged");
			expect(() => verifyWebhook(tampered, delivered.headers, created.secret)).toThrow(WebhookVerificationError);
			const wrong = `whsec_${crypto.randomBytes(32).toString("base64")}`;
			expect(() => verifyWebhook(delivered.body, delivered.headers, wrong)).toThrow(/No matching signature/);
			const { "webhook-signature": _dropped, ...unsigned } = delivered.headers;
			expect(() => verifyWebhook(delivered.body, unsigned, created.secret)).toThrow(/Missing webhook-signature/);
			// Correctly signed, but six minutes ago: outside the 5-minute tolerance (a replay).
			const messageId = String(delivered.headers["webhook-id"]);
			const staleAt = new Date(Date.now() - 6 * 60_000);
			const stale = {
				"webhook-id": messageId,
				"webhook-timestamp": String(Math.floor(staleAt.getTime() / 1000)),
				"webhook-signature": new Webhook(created.secret).sign(messageId, staleAt, delivered.body),
			};
			expect(() => verifyWebhook(delivered.body, stale, created.secret)).toThrow(/timestamp too old/);
			// The same message signed now passes: only the timestamp made the difference.
			const now = new Date();
			const fresh = { ...stale, "webhook-timestamp": String(Math.floor(now.getTime() / 1000)), "webhook-signature": new Webhook(created.secret).sign(messageId, now, delivered.body) };
			expect(verifyWebhook(delivered.body, fresh, created.secret).type).toBe("tasking:order_status");
		});

		it("deliveries.list (iterator, status filter), get and retry", async () => {
			await waitUntil(() => client.deliveries.list(created.id, { status: "succeeded" }).toArray(), list => list.length === 1, "the delivery to succeed");
			const all = await client.deliveries.list(created.id).toArray();
			expect(all).toHaveLength(1);
			expect(all[0]).toMatchObject({ webhook_id: created.id, event_id: order.event_id, status: "succeeded", attempt_count: 1, last_status_code: 200, waiting_for: null });
			expect(await client.deliveries.list(created.id, { status: "failed" }).toArray()).toEqual([]);
			const detail = await client.deliveries.get(created.id, all[0].id);
			expect(detail.attempts).toHaveLength(1);
			expect(detail.attempts[0]).toMatchObject({ success: true, status_code: 200 });
			expect(JSON.stringify(detail.payload)).toBe(JSON.stringify(JSON.parse(delivered.body)));
			const retried = await client.deliveries.retry(created.id, all[0].id);
			expect(retried).toMatchObject({ id: all[0].id, status: "pending" });
			const [, again] = await deliveriesTo(created, 2);
			expect(again.headers["webhook-id"]).toBe(delivered.headers["webhook-id"]);
			expect(verifyWebhook(again.body, again.headers, created.secret).type).toBe("tasking:order_status");
			// The receiver counts a request before it answers, and the result is written in a batch
			// after the answer: until then the delivery is pending again, which the stats below would see.
			await waitUntil(() => client.deliveries.list(created.id, { status: "succeeded" }).toArray(), list => list.length === 1 && list[0].attempt_count === 2, "the retry's result to be written");
			await expect(client.deliveries.get(created.id, crypto.randomUUID())).rejects.toBeInstanceOf(NotFoundError);
		});

		it("webhooks.stats and webhooks.recover", async () => {
			const stats = await client.webhooks.stats(created.id);
			expect(stats).toMatchObject({ webhook_id: created.id, window: "24h" });
			expect(stats.buckets).toHaveLength(24);
			expect(stats.totals.succeeded).toBeGreaterThanOrEqual(1);
			// Nothing failed in the window, so nothing is scheduled; a bad window is a typed 422.
			const since = new Date(Date.now() - 3_600_000).toISOString();
			expect(await client.webhooks.recover(created.id, { since })).toEqual({ scheduled: 0, remaining: 0 });
			await expect(client.webhooks.recover(created.id, { since: "yesterday" })).rejects.toMatchObject({ status: 422, errors: expect.arrayContaining([expect.objectContaining({ path: "since" })]) });
			await expect(client.webhooks.stats(crypto.randomUUID())).rejects.toBeInstanceOf(NotFoundError);
		});

		it("webhooks.rotate: during the grace period a delivery verifies with the new or the old secret", async () => {
			const rotated = await client.webhooks.rotate(created.id);
			expect(rotated.secret).toMatch(/^whsec_/);
			expect(rotated.secret).not.toBe(created.secret);
			// The dispatcher drops its cached secrets on webhooks.rotated; publish until a delivery
			// carries both signatures (new first, old second).
			let latest: ReceivedRequest | undefined;
			for (let tries = 0; tries < 5 && !latest; tries++) {
				const before = env.received(created).length;
				await publish("failed");
				const [last] = (await deliveriesTo(created, before + 1)).slice(-1);
				if (String(last.headers["webhook-signature"]).split(" ").length === 2) latest = last;
				else await sleep(2_000);
			}
			if (!latest) throw new Error("no delivery signed with both secrets");
			expect(verifyWebhook(latest.body, latest.headers, rotated.secret).type).toBe("tasking:order_status");
			expect(verifyWebhook(latest.body, latest.headers, created.secret).type).toBe("tasking:order_status");
			const stranger = `whsec_${crypto.randomBytes(32).toString("base64")}`;
			expect(verifyWebhook(latest.body, latest.headers, [stranger, rotated.secret]).type).toBe("tasking:order_status");
			expect(() => verifyWebhook(latest.body, latest.headers, [stranger])).toThrow(WebhookVerificationError);
		});
	});

	it("user.details, setEmail and updateSettings with If-Match", async () => {
		const details = await client.user.details();
		expect(details).toMatchObject({ user_id: user, email: `${user}@example.com`, etag: expect.any(String) });
		const topicSetting = () => client.user.details().then(d => d.user_metadata.notifications.flatMap(category => category.settings).find(setting => setting.topic === "tasking:order_status"));
		expect((await topicSetting())?.email).toBe(false);
		const on = await client.user.setEmail("tasking:order_status", true);
		expect(on.etag).not.toBe(details.etag);
		expect((await topicSetting())?.email).toBe(true);
		const stale = client.user.updateSettings([{ category: "tasking", settings: [{ topic: "tasking:order_status", email: false }] }], { ifMatch: details.etag });
		await expect(stale).rejects.toBeInstanceOf(PreconditionFailedError);
		const off = await client.user.updateSettings([{ category: "tasking", settings: [{ topic: "tasking:order_status", email: false }] }], { ifMatch: on.etag });
		expect(off.user_metadata.notifications[0].settings[0].email).toBe(false);
	});

	it("errors are typed and carry the problem details", async () => {
		const missing = await client.webhooks.get(crypto.randomUUID()).catch(err => err);
		expect(missing).toBeInstanceOf(NotFoundError);
		expect(missing).toBeInstanceOf(ApiError);
		expect(missing).toMatchObject({ status: 404, title: "Not Found", type: "urn:problem:not-found", detail: expect.any(String), errors: [] });
		// The gateway's request id, to quote when asking for help: generated, or the one the client sent.
		expect(missing.requestId).toMatch(/^[0-9a-f-]{36}$/);
		const traced = new SatelliteWebhooksClient({ baseUrl: env.stack.baseUrl, token, requestId: () => "sdk-trace-1" });
		expect(await traced.webhooks.get(crypto.randomUUID()).catch(err => err.requestId)).toBe("sdk-trace-1");

		const invalid = await client.webhooks.create({ name: "", url: "https://example.com/x", events: [] }).catch(err => err);
		expect(invalid).toBeInstanceOf(ValidationError);
		expect(invalid.status).toBe(422);
		expect(invalid.errors.map((problem: { path: string }) => problem.path).sort()).toEqual(["events", "name"]);
		const insecure = await client.webhooks.create({ name: "plain", url: "http://example.com/x", events: ["tasking:order_status"] }).catch(err => err);
		expect(insecure).toBeInstanceOf(ValidationError);
		expect(insecure.errors).toEqual([{ path: "url", message: expect.stringContaining("HTTP is not supported") }]);

		// An unknown field is reported under its own name.
		const unknown = await client.webhooks.create({ name: "x", url: "https://example.com/x", events: ["tasking:order_status"], colour: "red" } as never).catch(err => err);
		expect(unknown).toBeInstanceOf(ValidationError);
		expect(unknown.errors).toEqual([expect.objectContaining({ path: "colour" })]);

		const first = await newWebhook("twice");
		const duplicate = await client.webhooks.create({ name: "twice", url: `${first.url}-other`, events: ["tasking:order_status"] }).catch(err => err);
		expect(duplicate).toBeInstanceOf(ConflictError);
		expect(duplicate.toProblem()).toMatchObject({ status: 409, title: "Conflict" });

		const anonymous = new SatelliteWebhooksClient({ baseUrl: env.stack.baseUrl, token: "not.a.jwt" });
		const unauthenticated = await anonymous.topics.list().catch(err => err);
		expect(unauthenticated).toBeInstanceOf(AuthenticationError);
		expect(unauthenticated.status).toBe(401);
	});

	it("events.publish: one event or a list, answered with the event_ids in order, then delivered; typed 403 and 422", async () => {
		const producer = new SatelliteWebhooksClient({ baseUrl: env.stack.baseUrl, token: await env.stack.token("sdk-orders", { scope: "events:publish" }) });
		const webhook = webhookOf(await newWebhook("sdk events"));
		const order = () => ({ customer_id: customer, user_id: user, order_id: `sdk-ev-${crypto.randomBytes(3).toString("hex")}`, status: "Fulfilled" });
		const given = crypto.randomUUID();
		const list = [{ ...order(), event_id: given }, order()];
		const answer = await producer.events.publish(list);
		expect(answer.event_ids).toEqual([given, expect.stringMatching(/^[0-9a-f-]{36}$/)]);
		const single = order();
		expect((await producer.events.publish(single)).event_ids).toHaveLength(1);
		const received = await deliveriesTo(webhook, 3);
		const orders = received.map(request => {
			const event = verifyWebhook(request.body, request.headers, webhook.secret);
			return event.type === "tasking:order_status" ? event.data.order_id : event.type;
		});
		expect(orders.sort()).toEqual([...list, single].map(event => event.order_id).sort());

		const forbidden = await client.events.publish(order()).catch(err => err);
		expect(forbidden).toBeInstanceOf(ForbiddenError);
		expect(forbidden).toMatchObject({ status: 403, detail: expect.stringContaining("events:publish") });
		const invalid = await producer.events.publish([order(), { ...order(), status: "lost" }]).catch(err => err);
		expect(invalid).toBeInstanceOf(ValidationError);
		expect(invalid.errors).toEqual([{ path: "[1].status", message: expect.stringContaining("must be one of") }]);
	});

	it("a token function is asked before every request", async () => {
		let asked = 0;
		const fresh = new SatelliteWebhooksClient({ baseUrl: env.stack.baseUrl, token: () => (asked++, token) });
		await fresh.topics.list();
		await fresh.topics.list();
		expect(asked).toBe(2);
	});

	describe("the SDK examples of docs/api.md and docs/delivery.md, run as written", () => {
		const exampleDir = path.join(ROOT, "sdk", ".readme-examples");
		const children: ChildProcess[] = [];
		afterAll(() => {
			for (const child of children) child.kill();
			fs.rmSync(exampleDir, { recursive: true, force: true });
		});

		/** The ```ts block of docs/<doc> whose first line is `// <name>`. */
		const docExample = (doc: string, name: string) => {
			const text = fs.readFileSync(path.join(ROOT, "docs", doc), "utf8");
			const block = [...text.matchAll(/```ts\n([\s\S]*?)```/g)].map(match => match[1]).find(code => code.startsWith(`// ${name}\n`));
			if (!block) throw new Error(`docs/${doc} has no ts example named ${name}`);
			fs.mkdirSync(exampleDir, { recursive: true });
			const file = path.join(exampleDir, name);
			fs.writeFileSync(file, block);
			return file;
		};
		const tsx = (file: string, extraEnv: Record<string, string>) => {
			const child = spawn(path.join(ROOT, "node_modules", ".bin", "tsx"), [file], { cwd: ROOT, env: { ...process.env, ...extraEnv } });
			children.push(child);
			let stdout = "";
			let stderr = "";
			child.stdout!.on("data", chunk => (stdout += chunk));
			child.stderr!.on("data", chunk => (stderr += chunk));
			const exited = new Promise<number | null>(resolve => child.on("exit", resolve));
			return { child, exited, output: () => ({ stdout, stderr }) };
		};

		it("the client example creates a webhook, lists with the iterator and turns email on", async () => {
			const exampleUser = `readme-${customer}`;
			const exampleToken = await env.stack.token(exampleUser, { email: `${exampleUser}@example.com` });
			const run = tsx(docExample("api.md", "sdk-client.ts"), { API_URL: env.stack.baseUrl, TOKEN: exampleToken });
			expect(await run.exited).toBe(0);
			const { stdout } = run.output();
			expect(stdout).toMatch(/created [0-9a-f-]{36}, secret whsec_/);
			expect(stdout).toMatch(/Orders to ERP\s+https:\/\/hooks\.example\.com\/satellite\s+active/);
			const reader = new SatelliteWebhooksClient({ baseUrl: env.stack.baseUrl, token: exampleToken });
			expect((await reader.webhooks.list().toArray()).map(webhook => webhook.name)).toEqual(["Orders to ERP"]);
			const settings = (await reader.user.details()).user_metadata.notifications.flatMap(category => category.settings);
			expect(settings.find(setting => setting.topic === "tasking:order_status")?.email).toBe(true);
		});

		it("the node:http receiver example accepts a real delivery and refuses a tampered one", async () => {
			const created = webhookOf(await newWebhook("forwarded"));
			const order = await publish();
			const [delivered] = await deliveriesTo(created, 1);
			const port = await freePort();
			const run = tsx(docExample("delivery.md", "receiver.ts"), { PORT: String(port), WEBHOOK_SECRETS: created.secret });
			const forward = async (body: string) => {
				const headers = { "content-type": "application/json", ...Object.fromEntries(["webhook-id", "webhook-timestamp", "webhook-signature"].map(name => [name, String(delivered.headers[name])])) };
				// The receiver starts in the background; retry until it listens.
				return waitUntil(
					() =>
						new Promise<number>(resolve => {
							const request = http.request({ host: "127.0.0.1", port, path: "/satellite", method: "POST", headers }, response => {
								response.resume();
								resolve(response.statusCode ?? 0);
							});
							request.on("error", () => resolve(0));
							request.end(body);
						}),
					status => status !== 0,
					"the documented receiver to listen",
				);
			};
			expect(await forward(delivered.body)).toBe(200);
			expect(await forward(delivered.body.replace(order.order_id, "o-forged"))).toBe(400);
			await waitUntil(() => run.output().stdout, stdout => stdout.includes(`order ${order.order_id} is fulfilled`), "the receiver's log line");
		});
	});
});

describe("SDK events.publish and 503", () => {
	let stack: Stack;
	beforeAll(async () => {
		// No dispatcher yet: the gateway answers the intake 503 (a dependency is not running).
		stack = await startStack({ services: ["api", "topics", "webhooks", "users", "notifier"] });
	});
	afterAll(() => stack?.stop());

	it("gives events their event_ids and repeats a 503 with the same ones, after Retry-After", async () => {
		const bodies: string[] = [];
		const statuses: number[] = [];
		const recording: typeof fetch = async (input, init) => {
			bodies.push(String(init?.body));
			const response = await fetch(input, init);
			statuses.push(response.status);
			// The dependency starts while the client waits for the Retry-After.
			if (response.status === 503 && !stack.app.broker.getLocalService("dispatcher")) stack.app.broker.createService(DispatcherService as unknown as ServiceSchema);
			return response;
		};
		const token = await stack.token("sdk-orders", { scope: "events:publish" });
		const producer = new SatelliteWebhooksClient({ baseUrl: stack.baseUrl, token, fetch: recording });
		const event = { customer_id: "sdk-co", user_id: "sdk-user", order_id: "sdk-503", status: "staged" };
		const answer = await producer.events.publish([event]);
		expect(statuses).toEqual([503, 202]);
		expect(bodies[1]).toBe(bodies[0]);
		expect(JSON.parse(bodies[0])).toEqual([{ ...event, event_id: answer.event_ids[0] }]);
		expect(await stack.db("delivery_messages").where({ event_id: answer.event_ids[0] })).toHaveLength(1);
	}, 30_000);

	it("throws ServiceUnavailableError without repeating when maxRetries is 0", async () => {
		await stack.app.broker.destroyService("dispatcher");
		let requests = 0;
		const counting: typeof fetch = (input, init) => (requests++, fetch(input, init));
		const producer = new SatelliteWebhooksClient({ baseUrl: stack.baseUrl, token: await stack.token("sdk-orders", { scope: "events:publish" }), fetch: counting, maxRetries: 0 });
		const error = await producer.events.publish({ customer_id: "sdk-co", user_id: "sdk-user", order_id: "sdk-503-b", status: "staged" }).catch(err => err);
		expect(error).toBeInstanceOf(ServiceUnavailableError);
		expect(requests).toBe(1);
	});
});

describe("SDK and 429", () => {
	let stack: Stack;
	let relay: http.Server;
	let relayUrl: string;
	let relayed = 0;
	// Answers the next N requests with 429 and this Retry-After instead of passing them on.
	let refuse: { count: number; retryAfter: string } = { count: 0, retryAfter: "1" };
	// When each relayed request arrived (ms), to measure the client's waits.
	let relayedAt: number[] = [];

	beforeAll(async () => {
		stack = await startStack({ services: ["api", "topics"], env: { RATE_LIMIT_PER_MINUTE: "3" } });
		// A loopback proxy in front of the real gateway, like a rate-limiting edge proxy.
		relay = http.createServer((req, res) => {
			relayed++;
			relayedAt.push(performance.now());
			if (refuse.count > 0) {
				refuse.count--;
				res.writeHead(429, { "content-type": "application/problem+json", "retry-after": refuse.retryAfter });
				res.end(JSON.stringify({ type: "urn:problem:rate-limited", title: "Too Many Requests", status: 429, detail: "slow down" }));
				return;
			}
			const upstream = http.request(`${stack.baseUrl}${req.url}`, { method: req.method, headers: req.headers }, answer => {
				res.writeHead(answer.statusCode ?? 502, answer.headers);
				answer.pipe(res);
			});
			req.pipe(upstream);
		});
		await new Promise<void>(resolve => relay.listen(0, "127.0.0.1", resolve));
		relayUrl = `http://127.0.0.1:${(relay.address() as { port: number }).port}`;
	});
	afterAll(async () => {
		await new Promise(resolve => relay?.close(resolve));
		await stack?.stop();
	});

	it("waits for Retry-After and repeats the request", async () => {
		const client = new SatelliteWebhooksClient({ baseUrl: relayUrl, token: await stack.token("patient") });
		refuse = { count: 1, retryAfter: "1" };
		relayed = 0;
		relayedAt = [];
		expect(await client.topics.list()).toHaveLength(2);
		expect(relayed).toBe(2);
		// The repeat came no sooner than the second Retry-After asked for (a lower bound on a
		// deliberate wait: an SDK that repeated at once would fail here).
		expect(relayedAt[1] - relayedAt[0]).toBeGreaterThanOrEqual(1_000);
	});

	it("gives up after maxRetries, with a RateLimitError", async () => {
		const client = new SatelliteWebhooksClient({ baseUrl: relayUrl, token: await stack.token("patient"), maxRetries: 2 });
		refuse = { count: 5, retryAfter: "0" };
		relayed = 0;
		const error = await client.topics.list().catch(err => err);
		expect(error).toBeInstanceOf(RateLimitError);
		expect(error).toMatchObject({ status: 429, retryAfterSeconds: 0, detail: "slow down" });
		expect(relayed).toBe(3);
		refuse.count = 0;
	});

	it("does not wait longer than maxRetryDelayMs: the gateway's own 429 is thrown at once", async () => {
		const client = new SatelliteWebhooksClient({ baseUrl: stack.baseUrl, token: await stack.token("hasty"), maxRetryDelayMs: 5_000 });
		const errors: unknown[] = [];
		for (let i = 0; i < 4; i++) errors.push(await client.topics.list().then(() => null, err => err));
		const limited = errors.find(error => error instanceof RateLimitError) as RateLimitError;
		expect(limited).toBeDefined();
		expect(limited.retryAfterSeconds).toBeGreaterThan(5);
		expect(limited).toMatchObject({ status: 429, title: "Too Many Requests" });
	});
});
