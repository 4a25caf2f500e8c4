// A burst to an origin with no connection yet: the sender's first connection makes the one full
// TLS handshake, and the others resume its session (lib/tls-session-reuse.ts). Real HTTPS
// receivers on loopback count what each handshake was.
import crypto from "node:crypto";
import net from "node:net";
import { generateWebhookSecret } from "../lib/crypto";
import { WebhookSender, type DeliveryRequest } from "../lib/webhook-sender";
import { startHttpsReceiver, type HttpsReceiver, type HttpsReceiverOptions } from "./helpers/https-receiver";
import { freePort } from "./helpers/net";

const LOOPBACK = ["127.0.0.0/8"];
const CONNECTIONS = 8;
const BURST = 40;

describe("TLS sessions across a burst's connections", () => {
	const receivers: HttpsReceiver[] = [];
	const senders: WebhookSender[] = [];
	const secret = generateWebhookSecret();

	const receiver = async (options: HttpsReceiverOptions = {}) => {
		// Every request is held a little, so that the burst needs all its connections at once.
		const started = await startHttpsReceiver({ respond: { status: 200, body: "ok", delayMs: 20 }, ...options });
		receivers.push(started);
		return started;
	};
	const sender = (caFile: string) => {
		const made = new WebhookSender({ allowNets: LOOPBACK, caFile, connectionsPerOrigin: CONNECTIONS });
		senders.push(made);
		return made;
	};
	const burst = (to: WebhookSender, url: string) =>
		Promise.all(
			Array.from({ length: BURST }, (_, i): DeliveryRequest => ({ url: `${url}/hook`, messageId: `msg_${crypto.randomUUID()}`, body: JSON.stringify({ i }), secrets: [secret], timeoutMs: 10_000 })).map(request =>
				to.send(request),
			),
		);

	afterAll(async () => {
		await Promise.all(senders.map(made => made.close()));
		await Promise.all(receivers.map(made => made.close()));
	});

	it("makes one full handshake per origin and resumes it on the burst's other connections", async () => {
		const target = await receiver();
		const outcomes = await burst(sender(target.writeCaFile()), target.url);
		expect(outcomes.filter(outcome => outcome.success)).toHaveLength(BURST);
		expect(target.connections).toBe(CONNECTIONS);
		expect(target.handshakes).toEqual({ full: 1, resumed: CONNECTIONS - 1 });
	});

	it("keeps two servers on one host apart: each origin resumes its own session, never the other's", async () => {
		// localhost on two ports, with different session keys: undici keys its cache by host name only.
		const [first, second] = [await receiver(), await receiver()];
		const shared = sender(first.writeCaFile());
		const outcomes = [...(await burst(shared, first.url)), ...(await burst(shared, second.url))];
		expect(outcomes.filter(outcome => outcome.success)).toHaveLength(2 * BURST);
		expect([first.handshakes, second.handshakes]).toEqual([
			{ full: 1, resumed: CONNECTIONS - 1 },
			{ full: 1, resumed: CONNECTIONS - 1 },
		]);
	});

	it("delivers the whole burst to a server that resumes no session, with a full handshake per connection", async () => {
		// TLS 1.2 without tickets, and no session cache on the server: nothing can be resumed.
		const target = await receiver({ tls: { maxVersion: "TLSv1.2", secureOptions: crypto.constants.SSL_OP_NO_TICKET } });
		const outcomes = await burst(sender(target.writeCaFile()), target.url);
		expect(outcomes.filter(outcome => outcome.success)).toHaveLength(BURST);
		expect(target.handshakes).toEqual({ full: target.connections, resumed: 0 });
	});

	it("stops holding the others back after a few seconds when the first connection hangs in its handshake", async () => {
		// Accepts TCP connections and never says a word of TLS.
		const silent = net.createServer(() => undefined);
		await new Promise<void>(resolve => silent.listen(0, "127.0.0.1", () => resolve()));
		const accepted: net.Socket[] = [];
		silent.on("connection", socket => {
			accepted.push(socket);
			socket.on("error", () => undefined);
		});
		try {
			const caFile = (await receiver()).writeCaFile();
			const url = `https://127.0.0.1:${(silent.address() as net.AddressInfo).port}`;
			const requests = Array.from({ length: CONNECTIONS }, (): DeliveryRequest => ({ url: `${url}/hook`, messageId: `msg_${crypto.randomUUID()}`, body: "{}", secrets: [secret], timeoutMs: 5_000 }));
			const silentSender = sender(caFile);
			const outcomes = await Promise.all(requests.map(request => silentSender.send(request)));
			expect(outcomes.map(outcome => outcome.errorKind)).toEqual(Array(CONNECTIONS).fill("timeout"));
			// The first connection, then the others once they stopped waiting for it (3 s), within the 5 s deadline.
			expect(accepted.length).toBe(CONNECTIONS);
		} finally {
			for (const socket of accepted) socket.destroy();
			await new Promise<void>(resolve => silent.close(() => resolve()));
		}
	});

	it("lets the burst go when the first connection fails, each waiting connection failing on its own", async () => {
		// Every receiver of this file has the same certificate: any of them gives the CA file.
		const caFile = (await receiver()).writeCaFile();
		const outcomes = await burst(sender(caFile), `https://127.0.0.1:${await freePort()}`);
		expect(outcomes.map(outcome => outcome.detail)).toEqual(Array(BURST).fill("Connection refused"));
	});
});
