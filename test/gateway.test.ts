// The gateway's own behaviour: authentication, problem details, trailing slashes, body rules.
import { setTimeout as sleep } from "node:timers/promises";
import { SignJWT, UnsecuredJWT } from "jose";
import { expectProblem, startStack, type Stack } from "./helpers/stack";
import { eventDataJsonSchema } from "../lib/schemas/event-payloads";

describe("gateway", () => {
	let stack: Stack;
	let token: string;

	beforeAll(async () => {
		stack = await startStack({ services: ["api", "topics"] });
		token = await stack.token("alice", { email: "alice@example.com" });
	});
	afterAll(() => stack.stop());

	it("lists event topics for an authenticated caller, with and without a trailing slash", async () => {
		for (const path of ["/id/v3/webhooks/events", "/id/v3/webhooks/events/"]) {
			const response = await stack.request("GET", path, { token });
			expect(response.status).toBe(200);
			expect(response.body).toEqual([
				{ topic: "tasking:order_status", name: "Tasking order status updates", description: "Notifications for all tasking order updates", schema: eventDataJsonSchema("tasking:order_status") },
				{ topic: "webhook:disabled", name: "Webhook disabled", description: expect.stringContaining("410 Gone"), schema: eventDataJsonSchema("webhook:disabled") },
			]);
		}
	});

	it("answers 401 with WWW-Authenticate for missing, malformed, unsigned, expired and wrongly signed tokens", async () => {
		const secret = new TextEncoder().encode(stack.config.AUTH_JWT_SECRET);
		const expired = await new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("alice").setIssuedAt(1_000).setExpirationTime(2_000).sign(secret);
		const wrongKey = await new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("alice").setIssuedAt().setExpirationTime("1h").sign(new TextEncoder().encode("x".repeat(48)));
		const unsigned = new UnsecuredJWT({}).setSubject("alice").setIssuedAt().setExpirationTime("1h").encode();
		const noSub = await new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setIssuedAt().setExpirationTime("1h").sign(secret);
		const headers: Array<Record<string, string>> = [
			{},
			{ authorization: "Basic YWxpY2U6c2VjcmV0" },
			{ authorization: "Bearer not-a-jwt" },
			{ authorization: `Bearer ${unsigned}` },
			{ authorization: `Bearer ${expired}` },
			{ authorization: `Bearer ${wrongKey}` },
			{ authorization: `Bearer ${noSub}` },
		];
		for (const header of headers) {
			const response = await stack.request("GET", "/id/v3/webhooks/events", { headers: header });
			expectProblem(response, 401);
			expect(response.headers.get("www-authenticate")).toMatch(/^Bearer/);
		}
	});

	it("answers 404 problem details for unknown paths, authenticated or not under /id/v3", async () => {
		expectProblem(await stack.request("GET", "/id/v3/nothing-here", { token }), 404);
		expectProblem(await stack.request("GET", "/elsewhere", { token }), 404);
	});

	it("answers 503 when the service that owns a route is not running", async () => {
		const response = await stack.request("GET", "/id/v3/webhooks", { token });
		expectProblem(response, 503);
		expect(response.text).not.toMatch(/stack|at .*\.ts/);
	});

	it("answers 422 for a JSON body that is not an object: null, a string, a number, an array", async () => {
		for (const body of ["null", '"text"', "42", "[1,2]"]) {
			const response = await stack.request("PUT", "/id/v3/user/settings", { token, body, headers: { "content-type": "application/json" } });
			expectProblem(response, 422);
		}
	});

	it("releases the call context of a request that fails validation", async () => {
		// A validator that throws synchronously leaves the context tracked, and shutdown then
		// waits for it until its timeout.
		await expect(stack.app.broker.call("topics.register", { topic: "NOT A TOPIC" })).rejects.toMatchObject({ code: 422 });
		const topics = stack.app.broker.getLocalService("topics") as unknown as { _trackedContexts: unknown[] };
		expect(topics._trackedContexts).toHaveLength(0);
	});

	it("stops accepting a remembered token once it expires", async () => {
		const shortLived = await stack.token("alice", { expiresIn: "2s" });
		expect((await stack.request("GET", "/id/v3/webhooks/events", { token: shortLived })).status).toBe(200);
		let status = 200;
		for (let i = 0; i < 40 && status === 200; i++) {
			await sleep(250);
			status = (await stack.request("GET", "/id/v3/webhooks/events", { token: shortLived })).status;
		}
		expect(status).toBe(401);
	});
});
