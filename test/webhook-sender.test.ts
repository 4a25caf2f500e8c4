// The delivery transport against a real HTTPS receiver on loopback (self-signed certificate,
// trusted through caFile as WEBHOOK_CA_FILE would be): signing, status handling, redirects,
// timeouts, unreachable hosts, TLS trust, response excerpts, connection reuse, and rate-limited
// attempts past their deadline.
import { setTimeout as sleep } from "node:timers/promises";
import { WebhookVerificationError } from "standardwebhooks";
import { generateWebhookSecret } from "../lib/crypto";
import { DEFAULT_USER_AGENT, RESPONSE_EXCERPT_BYTES, WebhookSender, type DeliveryRequest } from "../lib/webhook-sender";
import { startHttpsReceiver, verifyDelivery, type HttpsReceiver } from "./helpers/https-receiver";
import { freePort } from "./helpers/net";

const LOOPBACK = ["127.0.0.0/8", "::1/128"];

describe("WebhookSender", () => {
	let receiver: HttpsReceiver;
	let sender: WebhookSender;
	let caFile: string;
	const secret = generateWebhookSecret();
	let sequence = 0;

	const delivery = (overrides: Partial<DeliveryRequest> = {}): DeliveryRequest => ({
		url: `${receiver.url}/hooks/orders`,
		messageId: `msg_${++sequence}`,
		body: JSON.stringify({ type: "tasking:order_status", timestamp: "2026-11-21T10:00:00Z", data: { order_id: `o-${sequence}`, status: "fulfilled" } }),
		secrets: [secret],
		timeoutMs: 5_000,
		...overrides,
	});

	beforeAll(async () => {
		receiver = await startHttpsReceiver();
		caFile = receiver.writeCaFile();
		sender = new WebhookSender({ allowNets: LOOPBACK, caFile });
	});
	afterAll(async () => {
		await sender.close();
		await receiver.close();
	});
	beforeEach(() => {
		receiver.requests.length = 0;
		receiver.setDefault({ status: 200, body: "ok" });
	});

	it("delivers a signed POST that the receiver verifies with standardwebhooks, and reports 200 as success", async () => {
		const request = delivery();
		const outcome = await sender.send(request);

		expect(outcome).toMatchObject({ success: true, statusCode: 200, errorKind: null, title: null, responseExcerpt: "ok" });
		expect(Number.isNaN(Date.parse(outcome.attemptedAt))).toBe(false);
		expect(outcome.durationMs).toBeGreaterThanOrEqual(0);

		const [received] = await receiver.waitFor(1);
		expect(received.method).toBe("POST");
		expect(received.path).toBe("/hooks/orders");
		expect(received.body).toBe(request.body);
		expect(received.headers["content-type"]).toBe("application/json");
		expect(received.headers["user-agent"]).toBe(DEFAULT_USER_AGENT);
		expect(DEFAULT_USER_AGENT).toMatch(/^satellite-webhooks\/\d+\.\d+\.\d+/);
		expect(received.headers["webhook-id"]).toBe(request.messageId);
		expect(received.headers["webhook-timestamp"]).toBe(String(Math.floor(Date.parse(outcome.attemptedAt) / 1000)));
		expect(verifyDelivery(received, secret)).toEqual(JSON.parse(request.body));
		expect(() => verifyDelivery(received, generateWebhookSecret())).toThrow(WebhookVerificationError);
	});

	it("makes a rate-limited attempt only when it can start by its deadline: past it, nothing is sent and the answer is null", async () => {
		const late = delivery({ messageId: "msg_late" });
		expect(await sender.sendBy(late, Date.now() - 1)).toBeNull();
		const timely = delivery({ messageId: "msg_timely" });
		const outcome = await sender.sendBy(timely, Date.now() + 60_000);
		expect(outcome).toMatchObject({ success: true, statusCode: 200 });
		await receiver.waitFor(1);
		expect(receiver.requests.map(request => request.headers["webhook-id"])).toEqual(["msg_timely"]);
	});

	it("signs with every secret given, so a receiver still holding the previous secret verifies during rotation", async () => {
		const previous = generateWebhookSecret();
		const newest = generateWebhookSecret();
		await sender.send(delivery({ secrets: [newest, previous] }));
		const [received] = await receiver.waitFor(1);
		expect(String(received.headers["webhook-signature"]).split(" ")).toHaveLength(2);
		expect(verifyDelivery(received, newest)).toBeTruthy();
		expect(verifyDelivery(received, previous)).toBeTruthy();
	});

	it("sends exactly the bytes it signed, non-ASCII text included", async () => {
		const body = '{"type":"tasking:order_status","data":{"order_name":"Sévérac \u{1F6F0}\u{FE0F} — 東京","n":1.50}}';
		await sender.send(delivery({ body }));
		const [received] = await receiver.waitFor(1);
		expect(received.body).toBe(body);
		expect(received.headers["content-length"]).toBe(String(Buffer.byteLength(body)));
		expect(verifyDelivery(received, secret)).toEqual(JSON.parse(body));
	});

	it("reports any other status as an HTTP Status Error with the code, in its own words", async () => {
		for (const status of [500, 201, 204, 404, 429]) {
			receiver.respondWith({ status, body: status === 204 ? "" : "<html>internal stack trace: secret stuff</html>" });
			const outcome = await sender.send(delivery());
			expect(outcome).toMatchObject({ success: false, statusCode: status, errorKind: "http_status", title: "HTTP Status Error" });
			expect(outcome.detail).toContain(String(status));
			expect(outcome.detail).not.toContain("secret stuff");
		}
	});

	it("never follows a redirect: 3xx is a failure and the Location target sees nothing", async () => {
		const target = await startHttpsReceiver();
		try {
			for (const status of [301, 302, 303, 307, 308]) {
				receiver.requests.length = 0;
				receiver.respondWith({ status, redirectTo: `${target.url}/elsewhere` });
				const outcome = await sender.send(delivery());
				expect(outcome).toMatchObject({ success: false, statusCode: status, errorKind: "http_status", title: "HTTP Status Error" });
				expect(outcome.detail).toMatch(/redirects are not followed/);
				expect(receiver.requests).toHaveLength(1);
			}
			expect(target.requests).toHaveLength(0);
			expect(target.connections).toBe(0);
		} finally {
			await target.close();
		}
	});

	it("ends an attempt that gets no answer as a Timeout at its time limit", async () => {
		receiver.respondWith({ hang: true });
		const outcome = await sender.send(delivery({ timeoutMs: 700 }));
		expect(outcome).toMatchObject({ success: false, statusCode: null, errorKind: "timeout", title: "Timeout", responseExcerpt: null });
		expect(outcome.detail).toBe("No response within 0.7 s");
		expect(receiver.requests).toHaveLength(1);
	});

	it("keeps the status of an answer whose body never finishes", async () => {
		// Headers arrive, then the body stalls: the answer was 200, the excerpt is what arrived.
		receiver.respondWith({ status: 200, headers: { "content-length": "100" }, body: "partial" });
		const outcome = await sender.send(delivery({ timeoutMs: 700 }));
		expect(outcome.statusCode).toBe(200);
		expect(outcome.success).toBe(true);
		expect(outcome.responseExcerpt).toBe("partial");
	});

	it("times out an attempt still waiting for a connection, and never sends it once one frees", async () => {
		// One connection per origin: the second attempt waits behind the first, past its deadline.
		const single = new WebhookSender({ allowNets: LOOPBACK, caFile, connectionsPerOrigin: 1 });
		try {
			receiver.setDefault({ status: 200, delayMs: 1_500, body: "late" });
			const first = single.send(delivery({ messageId: "msg_first" }));
			const waiting = await single.send(delivery({ messageId: "msg_waiting", timeoutMs: 300 }));
			expect(waiting).toMatchObject({ success: false, statusCode: null, errorKind: "timeout", detail: "No response within 0.3 s" });
			expect(await first).toMatchObject({ success: true, responseExcerpt: "late" });
			// The connection was free again after the first answer; the timed-out attempt did not use it.
			expect(await single.send(delivery({ messageId: "msg_after" }))).toMatchObject({ success: true });
			expect(receiver.requests.map(request => request.headers["webhook-id"])).toEqual(["msg_first", "msg_after"]);
		} finally {
			await single.close();
		}
	});

	it("reports a refused connection as Unreachable", async () => {
		const port = await freePort();
		const outcome = await sender.send(delivery({ url: `https://127.0.0.1:${port}/hook` }));
		expect(outcome).toMatchObject({ success: false, statusCode: null, errorKind: "unreachable", title: "Unreachable", detail: "Connection refused" });
	});

	it("reports an unresolvable host name as Unreachable", async () => {
		const outcome = await sender.send(delivery({ url: "https://no-such-host.invalid/hook" }));
		expect(outcome).toMatchObject({ success: false, statusCode: null, errorKind: "unreachable", title: "Unreachable" });
		expect(outcome.detail).toMatch(/could not be resolved/);
	});

	it("refuses a certificate it was not told to trust: Unreachable with a TLS reason, no request made", async () => {
		const untrusting = new WebhookSender({ allowNets: LOOPBACK });
		try {
			const outcome = await untrusting.send(delivery());
			expect(outcome).toMatchObject({ success: false, statusCode: null, errorKind: "unreachable", title: "Unreachable" });
			expect(outcome.detail).toMatch(/TLS handshake failed/);
			expect(receiver.requests).toHaveLength(0);
		} finally {
			await untrusting.close();
		}
	});

	it("reaches the receiver by host name when the allow list covers every address it resolves to", async () => {
		const outcome = await sender.send(delivery({ url: `https://localhost:${receiver.port}/by-name` }));
		// localhost may resolve to ::1 first; Happy Eyeballs then falls back to 127.0.0.1.
		expect(outcome).toMatchObject({ success: true, statusCode: 200 });
		expect((await receiver.waitFor(1))[0].path).toBe("/by-name");
	});

	it("caps the stored response excerpt at 4 KiB", async () => {
		receiver.respondWith({ status: 500, body: "x".repeat(256 * 1024) });
		const large = await sender.send(delivery());
		expect(large.statusCode).toBe(500);
		expect(large.responseExcerpt).toBe("x".repeat(RESPONSE_EXCERPT_BYTES));

		receiver.respondWith({ status: 200, body: "é".repeat(3000) });
		const multibyte = await sender.send(delivery());
		expect(Buffer.byteLength(multibyte.responseExcerpt ?? "")).toBeLessThanOrEqual(RESPONSE_EXCERPT_BYTES);
		expect(multibyte.responseExcerpt?.startsWith("é".repeat(2000))).toBe(true);

		receiver.respondWith({ status: 200, body: "a\u0000b" });
		expect((await sender.send(delivery())).responseExcerpt).toBe("ab");
	});

	it("stamps each attempt afresh while keeping the same webhook-id", async () => {
		const request = delivery();
		const first = await sender.send(request);
		// Move into the next whole second so the two attempts cannot share a timestamp.
		await sleep(1_000 - (Date.now() % 1_000) + 50);
		const second = await sender.send(request);

		const [one, two] = await receiver.waitFor(2);
		expect(one.headers["webhook-id"]).toBe(request.messageId);
		expect(two.headers["webhook-id"]).toBe(request.messageId);
		expect(one.headers["webhook-timestamp"]).toBe(String(Math.floor(Date.parse(first.attemptedAt) / 1000)));
		expect(two.headers["webhook-timestamp"]).toBe(String(Math.floor(Date.parse(second.attemptedAt) / 1000)));
		expect(Number(two.headers["webhook-timestamp"])).toBeGreaterThan(Number(one.headers["webhook-timestamp"]));
		expect(two.headers["webhook-signature"]).not.toBe(one.headers["webhook-signature"]);
		expect(verifyDelivery(one, secret)).toEqual(verifyDelivery(two, secret));
	});

	it("reuses kept-alive connections for one origin, and counts the connections it opens", async () => {
		const pooled = new WebhookSender({ allowNets: LOOPBACK, caFile, connectionsPerOrigin: 1 });
		const own = await startHttpsReceiver();
		try {
			for (let i = 0; i < 5; i++) expect((await pooled.send(delivery({ url: `${own.url}/hook` }))).success).toBe(true);
			expect(own.requests).toHaveLength(5);
			expect(own.connections).toBe(1);
			expect(pooled.connectionsOpened).toBe(1);
			// A receiver that closes each connection after its answer costs one per attempt.
			own.setDefault({ status: 200, body: "ok", headers: { connection: "close" } });
			for (let i = 0; i < 3; i++) expect((await pooled.send(delivery({ url: `${own.url}/hook` }))).success).toBe(true);
			expect(own.connections).toBe(3);
			expect(pooled.connectionsOpened).toBe(3);
		} finally {
			await pooled.close();
			await own.close();
		}
	});

	it("sends only to https:// URLs without credentials, and says why not", async () => {
		const port = receiver.port;
		const cases: Array<[string, string, RegExp]> = [
			[`http://127.0.0.1:${port}/hook`, "blocked", /Only https/],
			[`ftp://127.0.0.1:${port}/hook`, "blocked", /Only https/],
			[`https://user:pass@127.0.0.1:${port}/hook`, "blocked", /credentials/],
			["not a url", "unreachable", /not a valid/],
		];
		for (const [url, kind, detail] of cases) {
			const outcome = await sender.send(delivery({ url }));
			expect(outcome).toMatchObject({ success: false, statusCode: null, errorKind: kind });
			expect(outcome.detail).toMatch(detail);
		}
		expect(receiver.requests).toHaveLength(0);
	});

	it("fails fast on an unreadable or non-PEM CA file", () => {
		expect(() => new WebhookSender({ allowNets: [], caFile: "/nonexistent/ca.pem" })).toThrow(/WEBHOOK_CA_FILE: cannot read/);
		expect(() => new WebhookSender({ allowNets: [], caFile: __filename })).toThrow(/no PEM certificate/);
		expect(() => new WebhookSender({ allowNets: ["not-a-cidr"] })).toThrow(/not a CIDR/);
	});
});
