// Standard Webhooks signing: the official test vector, dual signatures during secret rotation,
// and the header format receivers parse.
import { Webhook, WebhookVerificationError } from "standardwebhooks";
import vectors from "../testdata/standard-webhooks-vectors.json";
import { generateWebhookSecret } from "../lib/crypto";
import { MAX_CACHED_SIGNING_KEYS, signMessage, unixSeconds } from "../lib/signing";

describe("signMessage", () => {
	it.each(vectors.vectors)("reproduces the official Standard Webhooks vector ($msg_id)", vector => {
		const signature = signMessage(vector.msg_id, new Date(vector.timestamp * 1000), vector.payload, [vector.secret]);
		expect(signature).toBe(vector.expected_signature);
	});

	it("writes one v1 signature per secret, space-separated, newest first", () => {
		const [newest, previous] = [generateWebhookSecret(), generateWebhookSecret()];
		// One fixed instant: separate new Date() calls can straddle a second and sign differently.
		const at = new Date();
		const header = signMessage("msg_1", at, '{"a":1}', [newest, previous]);
		const parts = header.split(" ");
		expect(parts).toHaveLength(2);
		for (const part of parts) expect(part).toMatch(/^v1,[A-Za-z0-9+/]{43}=$/);
		expect(parts[0]).toBe(signMessage("msg_1", at, '{"a":1}', [newest]));
		expect(parts[1]).toBe(signMessage("msg_1", at, '{"a":1}', [previous]));
	});

	it("lets a receiver holding either secret verify a dual-signed message with the library", () => {
		const [newest, previous] = [generateWebhookSecret(), generateWebhookSecret()];
		const body = JSON.stringify({ type: "tasking:order_status", data: { order_id: "o-1", status: "fulfilled" } });
		const now = new Date();
		const headers = {
			"webhook-id": "msg_2",
			"webhook-timestamp": String(unixSeconds(now)),
			"webhook-signature": signMessage("msg_2", now, body, [newest, previous]),
		};
		expect(new Webhook(newest).verify(body, headers)).toEqual(JSON.parse(body));
		expect(new Webhook(previous).verify(body, headers)).toEqual(JSON.parse(body));
		expect(() => new Webhook(generateWebhookSecret()).verify(body, headers)).toThrow(WebhookVerificationError);
	});

	it("covers the exact bytes: any change to body, id or timestamp breaks verification", () => {
		const secret = generateWebhookSecret();
		const body = '{"order_id":"o-1","note":"caf\u00e9 \u{1F6F0}"}';
		const now = new Date();
		const headers = { "webhook-id": "msg_3", "webhook-timestamp": String(unixSeconds(now)), "webhook-signature": signMessage("msg_3", now, body, [secret]) };
		const webhook = new Webhook(secret);
		expect(webhook.verify(body, headers)).toEqual(JSON.parse(body));
		// Same JSON value, different bytes: a re-serialised body must not verify.
		expect(() => webhook.verify(JSON.stringify(JSON.parse(body), null, 1), headers)).toThrow(WebhookVerificationError);
		expect(() => webhook.verify(body, { ...headers, "webhook-id": "msg_4" })).toThrow(WebhookVerificationError);
		expect(() => webhook.verify(body, { ...headers, "webhook-timestamp": String(unixSeconds(now) - 1) })).toThrow(WebhookVerificationError);
	});

	it("uses whole seconds, matching the webhook-timestamp header", () => {
		const secret = generateWebhookSecret();
		const start = new Date(1_700_000_000_000);
		const later = new Date(1_700_000_000_999);
		expect(unixSeconds(later)).toBe(1_700_000_000);
		expect(signMessage("m", later, "{}", [secret])).toBe(signMessage("m", start, "{}", [secret]));
	});

	it("signs right with a secret seen again after its cached key was forgotten, and with secrets that differ by one byte", () => {
		const first = generateWebhookSecret();
		const at = new Date();
		const body = '{"order_id":"o-1"}';
		const headers = (signature: string) => ({ "webhook-id": "msg_5", "webhook-timestamp": String(unixSeconds(at)), "webhook-signature": signature });
		const before = signMessage("msg_5", at, body, [first]);
		// Past the bound, the oldest keys are forgotten; the first secret's is made again.
		for (let i = 0; i <= MAX_CACHED_SIGNING_KEYS; i++) signMessage("msg_5", at, body, [generateWebhookSecret()]);
		expect(signMessage("msg_5", at, body, [first])).toBe(before);
		expect(new Webhook(first).verify(body, headers(before))).toEqual(JSON.parse(body));
		// A cache keyed by anything coarser than the whole secret would sign with the wrong key.
		const raw = Buffer.from(first.slice("whsec_".length), "base64");
		raw[raw.length - 1] ^= 1;
		const neighbour = `whsec_${raw.toString("base64")}`;
		const other = signMessage("msg_5", at, body, [neighbour]);
		expect(other).not.toBe(before);
		expect(new Webhook(neighbour).verify(body, headers(other))).toEqual(JSON.parse(body));
	});

	it("refuses to sign without a secret", () => {
		expect(() => signMessage("m", new Date(), "{}", [])).toThrow(/at least one secret/);
	});
});
