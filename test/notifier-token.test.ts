// Unsubscribe tokens: genuine and fresh ones verify; expired, tampered, foreign and unsigned fail.
import crypto from "node:crypto";
import { SignJWT, UnsecuredJWT } from "jose";
import { deriveUnsubscribeKey, InvalidUnsubscribeTokenError, signUnsubscribeToken, verifyUnsubscribeToken } from "../lib/unsubscribe-token";

const secretsKey = crypto.randomBytes(32).toString("base64");
const key = deriveUnsubscribeKey(secretsKey);
const claims = { userId: "auth0|alice", topic: "tasking:order_status" };
const DAY = 86_400_000;

async function reasonOf(promise: Promise<unknown>): Promise<string> {
	try {
		await promise;
		return "verified";
	} catch (err) {
		expect(err).toBeInstanceOf(InvalidUnsubscribeTokenError);
		return (err as InvalidUnsubscribeTokenError).reason;
	}
}

function base64urlJson(value: unknown): string {
	return Buffer.from(JSON.stringify(value)).toString("base64url");
}

describe("unsubscribe tokens", () => {
	it("derives a stable 32-byte key that is not SECRETS_KEY itself", () => {
		expect(key).toHaveLength(32);
		expect(Buffer.from(deriveUnsubscribeKey(secretsKey)).equals(Buffer.from(key))).toBe(true);
		expect(Buffer.from(key).equals(Buffer.from(secretsKey, "base64"))).toBe(false);
		expect(() => deriveUnsubscribeKey(Buffer.alloc(16).toString("base64"))).toThrow(/32 bytes/);
	});

	it("verifies a fresh token and returns its user and topic", async () => {
		const token = await signUnsubscribeToken(claims, key, 30 * DAY);
		expect(token.length).toBeLessThan(400);
		await expect(verifyUnsubscribeToken(token, key)).resolves.toEqual(claims);
	});

	it("refuses a token once its lifetime has passed", async () => {
		const issued = new Date("2026-01-01T00:00:00Z");
		const token = await signUnsubscribeToken(claims, key, 30 * DAY, issued);
		await expect(verifyUnsubscribeToken(token, key, new Date(issued.getTime() + 29 * DAY))).resolves.toEqual(claims);
		expect(await reasonOf(verifyUnsubscribeToken(token, key, new Date(issued.getTime() + 31 * DAY)))).toBe("expired");
	});

	it("refuses a token whose claims were changed after signing", async () => {
		const token = await signUnsubscribeToken(claims, key, DAY);
		const [header, payload, signature] = token.split(".");
		const changed = { ...JSON.parse(Buffer.from(payload, "base64url").toString()), sub: "bob" };
		expect(await reasonOf(verifyUnsubscribeToken([header, base64urlJson(changed), signature].join("."), key))).toBe("invalid");
		const flipped = signature.slice(0, -2) + (signature.endsWith("AA") ? "BB" : "AA");
		expect(await reasonOf(verifyUnsubscribeToken([header, payload, flipped].join("."), key))).toBe("invalid");
	});

	it("refuses tokens from another key, without a signature, or meant for something else", async () => {
		const otherKey = deriveUnsubscribeKey(crypto.randomBytes(32).toString("base64"));
		expect(await reasonOf(verifyUnsubscribeToken(await signUnsubscribeToken(claims, otherKey, DAY), key))).toBe("invalid");

		const unsigned = new UnsecuredJWT({ topic: claims.topic }).setIssuer("satellite-webhooks/notifier").setAudience("email-unsubscribe").setSubject("alice").setExpirationTime("1h").encode();
		expect(await reasonOf(verifyUnsubscribeToken(unsigned, key))).toBe("invalid");

		// Signed with the right key but lacking the audience: e.g. a bearer token shape.
		const bearerLike = await new SignJWT({ topic: claims.topic }).setProtectedHeader({ alg: "HS256" }).setSubject("alice").setExpirationTime("1h").sign(key);
		expect(await reasonOf(verifyUnsubscribeToken(bearerLike, key))).toBe("invalid");

		const noTopic = await new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setIssuer("satellite-webhooks/notifier").setAudience("email-unsubscribe").setSubject("alice").setExpirationTime("1h").sign(key);
		expect(await reasonOf(verifyUnsubscribeToken(noTopic, key))).toBe("invalid");

		const badTopic = await new SignJWT({ topic: "<script>" }).setProtectedHeader({ alg: "HS256" }).setIssuer("satellite-webhooks/notifier").setAudience("email-unsubscribe").setSubject("alice").setExpirationTime("1h").sign(key);
		expect(await reasonOf(verifyUnsubscribeToken(badTopic, key))).toBe("invalid");
	});

	it("refuses garbage and oversized input", async () => {
		for (const token of ["", "not-a-token", "a.b.c", "x".repeat(5000)]) {
			expect(await reasonOf(verifyUnsubscribeToken(token, key))).toBe("invalid");
		}
	});
});
