// Standard Webhooks v1 signatures for outgoing deliveries: HMAC-SHA256 (node:crypto, i.e.
// OpenSSL) over `${id}.${timestamp}.` followed by the exact bytes of the body. The
// `standardwebhooks` reference library computes the same value in pure JavaScript, several times
// slower; the tests hold this to the official vector and to the library's verification.
// Callers sign once per attempt and send exactly the bytes they signed.
import crypto from "node:crypto";

const SECRET_PREFIX = "whsec_";

/** Unix seconds, as carried in the webhook-timestamp header and covered by the signature. */
export function unixSeconds(timestamp: Date): number {
	return Math.floor(timestamp.getTime() / 1000);
}

/** A secret's key bytes: the base64 after the whsec_ prefix (as the reference library reads it). */
function keyOf(secret: string): Buffer {
	return Buffer.from(secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret, "base64");
}

/**
 * The webhook-signature header value: "v1,<base64 HMAC-SHA256>" for each secret, space-separated,
 * in the order given (newest secret first). During a rotation grace period both the new and the
 * old secret sign, so a receiver that still holds the old secret keeps verifying.
 */
export function signMessage(messageId: string, timestamp: Date, body: string | Buffer, secrets: string[]): string {
	if (secrets.length === 0) throw new Error("signMessage needs at least one secret");
	const prefix = `${messageId}.${unixSeconds(timestamp)}.`;
	const bytes = typeof body === "string" ? Buffer.from(body, "utf8") : body;
	let header = "";
	for (const secret of secrets) {
		const signature = crypto.createHmac("sha256", keyOf(secret)).update(prefix).update(bytes).digest("base64");
		header += header ? ` v1,${signature}` : `v1,${signature}`;
	}
	return header;
}
