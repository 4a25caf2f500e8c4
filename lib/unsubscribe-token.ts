// Signed, expiring tokens carried by the one-click unsubscribe link of notification emails
// (RFC 8058). A token says "user <sub> may turn email off for <topic>" until it expires.
//
// They are HS256 JWTs (jose) under a key derived with HKDF from SECRETS_KEY: SECRETS_KEY is the
// one secret every deployment has (AUTH_JWT_SECRET is absent when tokens come from a JWKS), and a
// derived key with its own issuer and audience means an unsubscribe token can never pass as a
// bearer token, nor a bearer token as an unsubscribe token. Rotating SECRETS_KEY invalidates
// every outstanding unsubscribe link.
import crypto from "node:crypto";
import { SignJWT, jwtVerify, errors as joseErrors } from "jose";
import { ExternalId } from "./schemas/events";
import { TopicName } from "./schemas/topics";

const ISSUER = "satellite-webhooks/notifier";
const AUDIENCE = "email-unsubscribe";
const HKDF_INFO = "satellite-webhooks unsubscribe-token v1";
/** Far above a real token's ~250 characters; anything longer is not ours. */
export const MAX_UNSUBSCRIBE_TOKEN_LENGTH = 2048;

export interface UnsubscribeClaims {
	userId: string;
	topic: string;
}

export type InvalidTokenReason = "expired" | "invalid";

export class InvalidUnsubscribeTokenError extends Error {
	constructor(readonly reason: InvalidTokenReason) {
		super(reason === "expired" ? "The unsubscribe link has expired" : "The unsubscribe link is invalid");
		this.name = "InvalidUnsubscribeTokenError";
	}
}

/** The 32-byte signing key for unsubscribe tokens, derived from SECRETS_KEY (base64). */
export function deriveUnsubscribeKey(secretsKeyBase64: string): Uint8Array {
	const secretsKey = Buffer.from(secretsKeyBase64, "base64");
	if (secretsKey.length !== 32) throw new Error("SECRETS_KEY must be base64 of 32 bytes");
	return new Uint8Array(crypto.hkdfSync("sha256", secretsKey, Buffer.alloc(0), HKDF_INFO, 32));
}

export async function signUnsubscribeToken(claims: UnsubscribeClaims, key: Uint8Array, ttlMs: number, now: Date = new Date()): Promise<string> {
	const issuedAt = Math.floor(now.getTime() / 1000);
	return new SignJWT({ topic: claims.topic })
		.setProtectedHeader({ alg: "HS256", typ: "JWT" })
		.setIssuer(ISSUER)
		.setAudience(AUDIENCE)
		.setSubject(claims.userId)
		.setIssuedAt(issuedAt)
		.setExpirationTime(issuedAt + Math.ceil(ttlMs / 1000))
		.sign(key);
}

/** Returns the claims of a genuine, unexpired token; throws InvalidUnsubscribeTokenError otherwise. */
export async function verifyUnsubscribeToken(token: string, key: Uint8Array, now: Date = new Date()): Promise<UnsubscribeClaims> {
	if (token.length > MAX_UNSUBSCRIBE_TOKEN_LENGTH) throw new InvalidUnsubscribeTokenError("invalid");
	let payload;
	try {
		({ payload } = await jwtVerify(token, key, {
			algorithms: ["HS256"],
			issuer: ISSUER,
			audience: AUDIENCE,
			requiredClaims: ["sub", "exp", "topic"],
			currentDate: now,
		}));
	} catch (err) {
		throw new InvalidUnsubscribeTokenError(err instanceof joseErrors.JWTExpired ? "expired" : "invalid");
	}
	const userId = ExternalId.safeParse(payload.sub);
	const topic = TopicName.safeParse(payload.topic);
	if (!userId.success || !topic.success) throw new InvalidUnsubscribeTokenError("invalid");
	return { userId: userId.data, topic: topic.data };
}
