// Webhook secrets: generation (Standard Webhooks "whsec_" form) and encryption at rest with
// AES-256-GCM. The webhook id is bound in as associated data, so a ciphertext copied onto
// another row does not decrypt.
import crypto from "node:crypto";

const SECRET_PREFIX = "whsec_";
const ENVELOPE_VERSION = "v1";

/** 32 random bytes, base64, with the whsec_ prefix (the library does not enforce the length). */
export function generateWebhookSecret(): string {
	return SECRET_PREFIX + crypto.randomBytes(32).toString("base64");
}

function keyFrom(base64Key: string): Buffer {
	const key = Buffer.from(base64Key, "base64");
	if (key.length !== 32) throw new Error("SECRETS_KEY must be base64 of 32 bytes");
	return key;
}

export function encryptSecret(plaintext: string, base64Key: string, associatedData: string): string {
	const iv = crypto.randomBytes(12);
	const cipher = crypto.createCipheriv("aes-256-gcm", keyFrom(base64Key), iv);
	cipher.setAAD(Buffer.from(associatedData, "utf8"));
	const ciphertext = Buffer.concat([cipher.update(plaintext, "utf8"), cipher.final()]);
	const tag = cipher.getAuthTag();
	return [ENVELOPE_VERSION, iv.toString("base64"), tag.toString("base64"), ciphertext.toString("base64")].join(":");
}

// Envelopes opened lately. The dispatcher asks for its subscribers' secrets on every intake batch,
// and AES-GCM over the same envelopes again showed in its profile. An envelope's random IV and
// tag make it name one plaintext under one key, so (key, AAD, envelope) is a sound cache key.
const OPENED_KEPT = 10_000;
const opened = new Map<string, string>();

export function decryptSecret(envelope: string, base64Key: string, associatedData: string): string {
	const cacheKey = `${base64Key}\u0000${associatedData}\u0000${envelope}`;
	const known = opened.get(cacheKey);
	if (known !== undefined) return known;
	const plaintext = openEnvelope(envelope, base64Key, associatedData);
	if (opened.size >= OPENED_KEPT) opened.clear();
	opened.set(cacheKey, plaintext);
	return plaintext;
}

function openEnvelope(envelope: string, base64Key: string, associatedData: string): string {
	const [version, iv, tag, ciphertext] = envelope.split(":");
	if (version !== ENVELOPE_VERSION || !iv || !tag || !ciphertext) throw new Error("Unrecognised secret envelope");
	const decipher = crypto.createDecipheriv("aes-256-gcm", keyFrom(base64Key), Buffer.from(iv, "base64"));
	decipher.setAAD(Buffer.from(associatedData, "utf8"));
	decipher.setAuthTag(Buffer.from(tag, "base64"));
	return Buffer.concat([decipher.update(Buffer.from(ciphertext, "base64")), decipher.final()]).toString("utf8");
}
