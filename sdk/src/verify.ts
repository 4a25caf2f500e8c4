// Receiver side: checks a delivery's Standard Webhooks signature and timestamp with the
// `standardwebhooks` library and returns the parsed event.
import { Webhook, WebhookVerificationError as LibraryVerificationError } from "standardwebhooks";
import { WebhookVerificationError } from "./errors";
import type { WebhookEvent } from "./api-types";

/** Header bags as node:http (`req.headers`), fetch (`Headers`) or a plain object give them. */
export type HeaderSource = Headers | Record<string, string | string[] | undefined>;

const SIGNED_HEADERS = ["webhook-id", "webhook-timestamp", "webhook-signature"] as const;

function signedHeaders(headers: HeaderSource): Record<string, string> {
	const read = (name: string): string | undefined => {
		if (typeof (headers as Headers).get === "function") return (headers as Headers).get(name) ?? undefined;
		const bag = headers as Record<string, string | string[] | undefined>;
		const key = Object.keys(bag).find(candidate => candidate.toLowerCase() === name);
		const value = key === undefined ? undefined : bag[key];
		return Array.isArray(value) ? value.join(" ") : value;
	};
	const picked: Record<string, string> = {};
	for (const name of SIGNED_HEADERS) {
		const value = read(name);
		if (!value) throw new WebhookVerificationError(`Missing ${name} header`);
		picked[name] = value;
	}
	return picked;
}

/**
 * Verifies a delivery and returns its body, typed by `type`. Pass the raw body exactly as
 * received (parsing and re-serialising JSON changes the bytes). `secret` may be a list: during a
 * rotation, pass the new and the old secret, and a delivery signed with either is accepted.
 * Timestamps more than 5 minutes from now are refused (replay protection).
 *
 * Throws WebhookVerificationError when the delivery must be refused (answer 400).
 * Deduplicate on the `webhook-id` header: a retry of the same delivery repeats it.
 */
export function verifyWebhook(rawBody: string | Buffer | Uint8Array, headers: HeaderSource, secret: string | readonly string[]): WebhookEvent {
	const secrets = typeof secret === "string" ? [secret] : [...secret];
	if (secrets.length === 0) throw new TypeError("verifyWebhook needs at least one secret");
	const body = typeof rawBody === "string" ? rawBody : Buffer.from(rawBody);
	const picked = signedHeaders(headers);
	let reason = "No matching signature";
	for (const candidate of secrets) {
		try {
			const event = new Webhook(candidate).verify(body, picked) as WebhookEvent;
			if (!event || typeof event !== "object" || typeof event.type !== "string") throw new WebhookVerificationError("The body is not a webhook event");
			return event;
		} catch (err) {
			if (!(err instanceof LibraryVerificationError)) {
				if (err instanceof WebhookVerificationError) throw err;
				// A wrong-format secret or unparsable JSON: no other secret changes that for the body.
				if (err instanceof SyntaxError) throw new WebhookVerificationError("The body is not valid JSON");
				throw err;
			}
			reason = err.message;
			// The timestamp is checked before any signature: another secret would fail the same way.
			if (/timestamp/i.test(reason)) break;
		}
	}
	throw new WebhookVerificationError(reason);
}
