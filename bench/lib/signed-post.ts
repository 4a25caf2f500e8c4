// The plainest signed Standard Webhooks POST we know how to write, for the benchmark's floor and
// its bare relay: node:crypto HMAC straight over the bytes sent, undici's request, nothing else.
import crypto from "node:crypto";
import { request, type Agent } from "undici";

export interface SignedTarget {
	url: string;
	/** The whsec_ secret's key bytes. */
	key: Buffer;
}

export const keyOf = (secret: string) => Buffer.from(secret.replace(/^whsec_/, ""), "base64");

export async function signedPost(agent: Agent, target: SignedTarget, body: Buffer): Promise<number> {
	const messageId = `msg_${crypto.randomUUID()}`;
	const timestamp = String(Math.floor(Date.now() / 1000));
	const signature = crypto.createHmac("sha256", target.key).update(`${messageId}.${timestamp}.`).update(body).digest("base64");
	const response = await request(target.url, {
		method: "POST",
		dispatcher: agent,
		headers: { "content-type": "application/json", "webhook-id": messageId, "webhook-timestamp": timestamp, "webhook-signature": `v1,${signature}` },
		body,
	});
	await response.body.dump();
	return response.statusCode;
}
