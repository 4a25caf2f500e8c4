// Standard Webhooks v1 signatures for outgoing deliveries. The HMAC itself comes from the
// `standardwebhooks` reference library; this file only decides which secrets sign and how the
// header value is assembled. Callers must send exactly the `body` string they signed.
import { Webhook } from "standardwebhooks";

/** Unix seconds, as carried in the webhook-timestamp header and covered by the signature. */
export function unixSeconds(timestamp: Date): number {
	return Math.floor(timestamp.getTime() / 1000);
}

/**
 * The webhook-signature header value: "v1,<base64 HMAC-SHA256>" for each secret, space-separated,
 * in the order given (newest secret first). During a rotation grace period both the new and the
 * old secret sign, so a receiver that still holds the old secret keeps verifying.
 */
export function signMessage(messageId: string, timestamp: Date, body: string, secrets: string[]): string {
	if (secrets.length === 0) throw new Error("signMessage needs at least one secret");
	return secrets.map(secret => new Webhook(secret).sign(messageId, timestamp, body)).join(" ");
}
