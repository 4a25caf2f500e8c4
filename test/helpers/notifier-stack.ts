// The notifier's test stack for the enclosing describe block: the gateway, topics, users and the
// notifier (no dispatcher: email does not depend on it) on one database, with a real SMTP server.
// Read `stack` and `smtp` inside the tests (they exist once beforeAll ran).
import { startStack, type Stack } from "./stack";
import type { DatabaseKind } from "./services";
import { startSmtpServer, type TestSmtpServer } from "./smtp-server";

export const ORDER_STATUS_TOPIC = "tasking:order_status";

export function useNotifierStack(database: DatabaseKind, env: Record<string, string>): { readonly stack: Stack; readonly smtp: TestSmtpServer } {
	const parts = {} as { stack: Stack; smtp: TestSmtpServer };
	beforeAll(async () => {
		parts.smtp = await startSmtpServer();
		parts.stack = await startStack({ database, services: ["api", "topics", "users", "notifier"], env: { SMTP_URL: parts.smtp.url, ...env } });
	});
	afterAll(async () => {
		await parts.stack?.stop();
		await parts.smtp?.close();
	});
	return parts;
}

/** A request with the user's token, which makes the gateway store their claims (users.touch). */
export async function signIn(stack: Stack, sub: string, claims: { customer: string; email?: string; name?: string }): Promise<string> {
	const token = await stack.token(sub, claims);
	expect((await stack.request("GET", "/id/v3/user/details", { token })).status).toBe(200);
	return token;
}

/** Turns the order-status email on or off through PUT /id/v3/user/settings. */
export async function setOrderStatusEmail(stack: Stack, token: string, email: boolean): Promise<void> {
	const response = await stack.request("PUT", "/id/v3/user/settings", { token, body: { notifications: [{ category: "tasking", settings: [{ topic: ORDER_STATUS_TOPIC, email }] }] } });
	expect(response.status).toBe(200);
}
