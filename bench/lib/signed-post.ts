// The plainest signed Standard Webhooks POST we know how to write, for the benchmark's floor and
// its bare relay: node:crypto HMAC straight over the bytes sent, undici's request, nothing else.
import crypto from "node:crypto";
import { request, type Agent } from "undici";

export interface SignedTarget {
	url: string;
	/** The whsec_ secret's key, a KeyObject (secretKeyOf) as the service uses (lib/signing.ts says why). */
	key: crypto.KeyObject;
}

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

/** The floor's body: the shape and size of an order-status delivery, numbered by `i`. */
export function floorBody(i: number): string {
	return `{"type":"tasking:order_status","timestamp":"${new Date().toISOString()}","data":{"order_id":"order-${i}","status":"fulfilled","previous_status":null,"user_id":"bench-user","order_name":"Benchmark order"}}`;
}

/**
 * Runs `count` attempts through `attempt`, `concurrency` loops at a time, loop k always on
 * targets[k % targets.length]: the floor's way of spreading a load over the endpoints.
 */
export async function concurrentLoops<Target>(targets: Target[], count: number, concurrency: number, attempt: (target: Target, i: number) => Promise<unknown>): Promise<void> {
	let next = 0;
	const loop = async (worker: number) => {
		const target = targets[worker % targets.length];
		while (next < count) await attempt(target, next++);
	};
	await Promise.all(Array.from({ length: concurrency }, (_, worker) => loop(worker)));
}
