// Contract edges through the real gateway: the 64 KiB body limit to the byte, paging with no
// `next` link when the last page is exactly full, trailing slashes on the delivery-log and retry
// routes, and following `links[].href` the way docs/api.md says (resolved against the API's URL).
import crypto from "node:crypto";
import { expectProblem, snapshotTables } from "./helpers/stack";
import { testDatabases } from "./helpers/services";
import { startDeliveryStack, waitUntil, type DeliveryStack } from "./helpers/delivery-stack";

const LIMIT = 64 * 1024;

describe.each(testDatabases())("contract edges on %s", database => {
	let env: DeliveryStack;
	const newToken = () => env.stack.token(`user-${crypto.randomBytes(4).toString("hex")}`);

	beforeAll(async () => {
		env = await startDeliveryStack(database);
	});
	afterAll(() => env?.stop());

	/** A valid create body, padded with JSON whitespace to exactly `bytes` bytes. */
	const paddedBody = (bytes: number) => {
		const body = JSON.stringify({ name: `padded ${crypto.randomUUID()}`, url: `https://hooks.example.com/${crypto.randomUUID()}`, events: ["tasking:order_status"] });
		return body + " ".repeat(bytes - Buffer.byteLength(body));
	};

	it("accepts a body of exactly 64 KiB and answers 413 to one byte more, changing nothing", async () => {
		const token = await newToken();
		const exact = paddedBody(LIMIT);
		expect(Buffer.byteLength(exact)).toBe(LIMIT);
		const accepted = await env.stack.request("POST", "/id/v3/webhooks", { token, body: exact, headers: { "content-type": "application/json" } });
		expect(accepted.status).toBe(201);

		const before = await snapshotTables(env.stack.db, ["webhooks"]);
		const over = paddedBody(LIMIT + 1);
		expect(Buffer.byteLength(over)).toBe(LIMIT + 1);
		const refused = await env.stack.request("POST", "/id/v3/webhooks", { token, body: over, headers: { "content-type": "application/json" } });
		expectProblem(refused, 413);
		expect(await snapshotTables(env.stack.db, ["webhooks"])).toEqual(before);
	});

	it("gives no next link on a last page that is exactly full, for webhooks and deliveries", async () => {
		const token = await newToken();
		const hooks = [];
		for (let i = 0; i < 4; i++) hooks.push(await env.createWebhook(token));
		const first = await env.stack.request("GET", "/id/v3/webhooks?per_page=2", { token });
		expect(first.body.links).toHaveLength(1);
		// The README: links[].href is a path on the API's origin; resolve it against the URL called.
		const nextUrl = new URL(first.body.links[0].href, `${env.stack.baseUrl}/id/v3/webhooks?per_page=2`);
		const second = await env.stack.request("GET", nextUrl.pathname + nextUrl.search, { token });
		expect(second.status).toBe(200);
		expect(second.body.webhooks.map((hook: { id: string }) => hook.id)).toEqual(hooks.slice(2).map(hook => hook.id));
		expect(second.body.links).toEqual([]);
		const whole = await env.stack.request("GET", "/id/v3/webhooks?per_page=4", { token });
		expect(whole.body.links).toEqual([]);

		const [hook] = hooks;
		const customerId = (await env.stack.db("webhooks").where({ id: hook.id }).first()).customer_id;
		// The token has no customer claim: its user is the implicit customer "~<user id>".
		const userId = customerId.replace(/^~/, "");
		for (let i = 0; i < 4; i++) {
			await env.stack.app.broker.call("dispatcher.publish", { event_id: crypto.randomUUID(), customer_id: customerId, user_id: userId, order_id: `o-${i}`, status: "staged" });
		}
		const deliveriesPath = `/id/v3/webhooks/${hook.id}/deliveries`;
		const page1 = await env.stack.request("GET", `${deliveriesPath}?per_page=2`, { token });
		expect(page1.body.context).toMatchObject({ matched: 4, returned: 2 });
		const page2 = await env.stack.request("GET", page1.body.links[0].href.replace(/^https?:\/\/[^/]+/, ""), { token });
		expect(page2.body.deliveries).toHaveLength(2);
		expect(page2.body.links).toEqual([]);
	});

	it("serves the delivery log, a delivery and its retry with a trailing slash too", async () => {
		const token = await newToken();
		const hook = await env.createWebhook(token);
		const customerId = (await env.stack.db("webhooks").where({ id: hook.id }).first()).customer_id;
		await env.stack.app.broker.call("dispatcher.publish", { event_id: crypto.randomUUID(), customer_id: customerId, user_id: customerId.replace(/^~/, ""), order_id: "o-slash", status: "staged" });
		const list = await waitUntil(
			() => env.stack.request("GET", `/id/v3/webhooks/${hook.id}/deliveries/`, { token }),
			response => response.status === 200 && response.body.deliveries[0]?.status === "succeeded",
			"the delivery to succeed",
		);
		const deliveryId = list.body.deliveries[0].id;
		const detail = await env.stack.request("GET", `/id/v3/webhooks/${hook.id}/deliveries/${deliveryId}/`, { token });
		expect(detail.status).toBe(200);
		expect(detail.body).toMatchObject({ id: deliveryId, attempts: [expect.objectContaining({ success: true })] });
		const retry = await env.stack.request("POST", `/id/v3/webhooks/${hook.id}/deliveries/${deliveryId}/retry/`, { token });
		expect(retry.status).toBe(202);
		expect(retry.body).toMatchObject({ id: deliveryId, status: "pending" });
		await waitUntil(() => env.received(hook).length, count => count === 2, "the retried attempt");
	});
});
