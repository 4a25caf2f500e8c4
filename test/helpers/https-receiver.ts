// A real HTTPS webhook receiver for tests: a node:https server on loopback with a self-signed
// certificate generated in the test run, recording every request and answering as scripted.
//
//   const receiver = await startHttpsReceiver();          // answers 200 "ok" by default
//   receiver.url                                         // "https://127.0.0.1:<port>"
//   receiver.caPem / receiver.writeCaFile()              // trust it: WEBHOOK_CA_FILE=<path>
//   receiver.respondWith({ status: 500 }, { status: 200 }) // queue: one answer per request, in order
//   receiver.setDefault(request => ({ status: 200 }))     // answer once the queue is empty
//   await receiver.waitFor(2)                            // first 2 requests (or a predicate)
//   receiver.requests / receiver.connections             // what arrived, TCP connections accepted
//   verifyDelivery(request, secret)                      // standardwebhooks check of a request
//   await receiver.close()
//
// A scripted answer: { status?, body?, headers?, delayMs?, redirectTo?, hang? }. `hang` never
// answers (the socket stays open until the client gives up or close() runs); `redirectTo` sends
// a 302 (or the given 3xx status) with that Location.
import { setTimeout as sleep } from "node:timers/promises";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import https from "node:https";
import { createSecureContext } from "node:tls";
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import selfsigned from "selfsigned";
import { Webhook } from "standardwebhooks";

export interface ReceivedRequest {
	method: string;
	/** Path and query, e.g. "/hook?x=1". */
	path: string;
	/** Lower-cased header names, as node parses them. */
	headers: IncomingHttpHeaders;
	/** The raw body exactly as received (UTF-8). */
	body: string;
	receivedAt: Date;
	/** The status the receiver answered, once it did (unset while it hangs or waits). */
	answeredStatus?: number;
}

/** The request's path without its query: the webhook a request was for, in tests that give each its own path. */
export function pathOf(request: ReceivedRequest): string {
	return request.path.split("?")[0];
}

export interface ScriptedResponse {
	status?: number;
	body?: string;
	headers?: Record<string, string>;
	/** Wait this long before answering. */
	delayMs?: number;
	/** Answer with a redirect (302 unless `status` is another 3xx) to this Location. */
	redirectTo?: string;
	/** Never answer. */
	hang?: boolean;
}

export type Responder = (request: ReceivedRequest) => ScriptedResponse | Promise<ScriptedResponse>;

export interface HttpsReceiverOptions {
	/** Loopback address to listen on; "::1" for IPv6. Default "127.0.0.1". */
	host?: string;
	/** Answer when the queue is empty. Default { status: 200, body: "ok" }. */
	respond?: ScriptedResponse | Responder;
	/** TLS settings of the server beyond its key and certificate (a version, secureOptions). */
	tls?: Pick<https.ServerOptions, "maxVersion" | "secureOptions">;
}

export interface HttpsReceiver {
	url: string;
	port: number;
	/** PEM of the self-signed certificate; it is its own CA. */
	caPem: string;
	/** Writes caPem into a temporary file and returns its path (for WEBHOOK_CA_FILE). */
	writeCaFile(): string;
	requests: ReceivedRequest[];
	/** TCP connections accepted so far (keep-alive reuse shows as fewer connections than requests). */
	readonly connections: number;
	/** TLS handshakes that resumed an earlier session (no certificate sent), and those that did not. */
	readonly handshakes: { full: number; resumed: number };
	respondWith(...responses: Array<ScriptedResponse | Responder>): void;
	setDefault(respond: ScriptedResponse | Responder): void;
	/** Resolves with the matching requests once there are `count` of them (or one matches); rejects after timeoutMs. */
	waitFor(countOrPredicate: number | ((request: ReceivedRequest) => boolean), timeoutMs?: number): Promise<ReceivedRequest[]>;
	close(): Promise<void>;
}

interface Certificate {
	key: string;
	cert: string;
}

let certificate: Certificate | undefined;

/**
 * One certificate per test file: generating RSA keys in JavaScript takes a moment. Now and then
 * OpenSSL will not load what selfsigned (node-forge) generated: a CI run failed in
 * https.createServer with "asn1 encoding routines::illegal padding". Such a pair is drawn again.
 */
export function testCertificate(): Certificate {
	for (let draw = 1; !certificate; draw += 1) {
		const generated = selfsigned.generate([{ name: "commonName", value: "localhost" }], {
			keySize: 2048,
			days: 2,
			algorithm: "sha256",
			extensions: [
				{ name: "basicConstraints", cA: true },
				{ name: "keyUsage", keyCertSign: true, digitalSignature: true, keyEncipherment: true },
				{ name: "extKeyUsage", serverAuth: true },
				{
					name: "subjectAltName",
					altNames: [
						{ type: 2, value: "localhost" },
						{ type: 7, ip: "127.0.0.1" },
						{ type: 7, ip: "::1" },
					],
				},
			],
		});
		try {
			// What https.createServer does with them.
			createSecureContext({ key: generated.private, cert: generated.cert });
			certificate = { key: generated.private, cert: generated.cert };
		} catch (err) {
			if (draw >= 5) throw err;
		}
	}
	return certificate;
}

/** Verifies a received delivery with the standardwebhooks library; returns the parsed payload or throws. */
export function verifyDelivery(request: ReceivedRequest, secret: string): unknown {
	const headers = {
		"webhook-id": String(request.headers["webhook-id"] ?? ""),
		"webhook-timestamp": String(request.headers["webhook-timestamp"] ?? ""),
		"webhook-signature": String(request.headers["webhook-signature"] ?? ""),
	};
	return new Webhook(secret).verify(request.body, headers);
}

function readBody(request: IncomingMessage): Promise<string> {
	return new Promise((resolve, reject) => {
		const chunks: Buffer[] = [];
		request.on("data", (chunk: Buffer) => chunks.push(chunk));
		request.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
		request.on("error", reject);
	});
}

export async function startHttpsReceiver(options: HttpsReceiverOptions = {}): Promise<HttpsReceiver> {
	const host = options.host ?? "127.0.0.1";
	const { key, cert } = testCertificate();
	const requests: ReceivedRequest[] = [];
	const queue: Array<ScriptedResponse | Responder> = [];
	let fallback: ScriptedResponse | Responder = options.respond ?? { status: 200, body: "ok" };
	const sockets = new Set<Socket>();
	const waiters = new Set<() => void>();
	const caFiles: string[] = [];
	let connections = 0;
	const handshakes = { full: 0, resumed: 0 };

	async function answer(request: IncomingMessage, response: ServerResponse): Promise<void> {
		const received: ReceivedRequest = {
			method: request.method ?? "",
			path: request.url ?? "",
			headers: request.headers,
			body: await readBody(request),
			receivedAt: new Date(),
		};
		requests.push(received);
		for (const wake of waiters) wake();

		const next = queue.shift() ?? fallback;
		const scripted = typeof next === "function" ? await next(received) : next;
		if (scripted.hang) return;
		if (scripted.delayMs) await sleep(scripted.delayMs);
		if (response.destroyed) return;
		const headers: Record<string, string> = { "content-type": "text/plain", ...scripted.headers };
		let status = scripted.status ?? 200;
		if (scripted.redirectTo) {
			headers.location = scripted.redirectTo;
			if (status < 300 || status > 399) status = 302;
		}
		response.writeHead(status, headers);
		response.end(scripted.body ?? "");
		received.answeredStatus = status;
	}

	const server = https.createServer({ ...options.tls, key, cert }, (request, response) => {
		answer(request, response).catch(() => response.destroy());
	});
	server.on("connection", (socket: Socket) => {
		connections += 1;
		sockets.add(socket);
		socket.on("close", () => sockets.delete(socket));
	});
	server.on("secureConnection", socket => (socket.isSessionReused() ? (handshakes.resumed += 1) : (handshakes.full += 1)));
	// A client that rejects our certificate aborts the handshake; that is expected in tests.
	server.on("tlsClientError", () => {});

	await new Promise<void>((resolve, reject) => {
		server.once("error", reject);
		server.listen(0, host, () => resolve());
	});
	const { port } = server.address() as { port: number };
	const url = `https://${host.includes(":") ? `[${host}]` : host}:${port}`;

	return {
		url,
		port,
		caPem: cert,
		writeCaFile() {
			const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "receiver-ca-")), "ca.pem");
			fs.writeFileSync(file, cert);
			caFiles.push(file);
			return file;
		},
		requests,
		get connections() {
			return connections;
		},
		get handshakes() {
			return { ...handshakes };
		},
		respondWith(...responses) {
			queue.push(...responses);
		},
		setDefault(respond) {
			fallback = respond;
		},
		waitFor(countOrPredicate, timeoutMs = 10_000) {
			const matches = () =>
				typeof countOrPredicate === "number"
					? requests.length >= countOrPredicate
						? requests.slice(0, countOrPredicate)
						: undefined
					: requests.some(countOrPredicate)
						? requests.filter(countOrPredicate)
						: undefined;
			return new Promise((resolve, reject) => {
				const found = matches();
				if (found) return resolve(found);
				const check = () => {
					const now = matches();
					if (!now) return;
					clearTimeout(timer);
					waiters.delete(check);
					resolve(now);
				};
				const timer = setTimeout(() => {
					waiters.delete(check);
					const wanted = typeof countOrPredicate === "number" ? `${countOrPredicate} request(s)` : "a matching request";
					reject(new Error(`receiver ${url}: waited ${timeoutMs} ms for ${wanted}, got ${requests.length}`));
				}, timeoutMs);
				waiters.add(check);
			});
		},
		async close() {
			for (const socket of sockets) socket.destroy();
			await new Promise<void>(resolve => server.close(() => resolve()));
			for (const file of caFiles) fs.rmSync(path.dirname(file), { recursive: true, force: true });
		},
	};
}
