// The HTTPS transport of webhook deliveries: one signed POST per attempt, judged by its answer,
// with an SSRF guard at connect time. It never throws for network trouble; every attempt ends in
// a DeliveryOutcome the dispatcher can store and show.
//
// SSRF guard: the destination's addresses are checked inside the undici connector, on the very
// lookup whose answer the socket then connects to, so a DNS answer that changes between a check
// and the connection (rebinding) cannot slip through. IP-literal hosts skip DNS in Node, so they
// are checked before any socket is opened. A refused attempt sends no packet to the address.
import dns from "node:dns";
import fs from "node:fs";
import tls from "node:tls";
import { performance } from "node:perf_hooks";
import { Agent, buildConnector, type Dispatcher } from "undici";
import { isBlockedAddress, isIpLiteral, parseAllowList, type AllowList } from "./address-ranges";
import { signMessage, unixSeconds } from "./signing";
import { RETRY_AFTER_STATUSES, parseRetryAfter } from "./retry-after";
import { TlsSessionReuse } from "./tls-session-reuse";
import { version } from "../package.json";

export type DeliveryErrorKind = "http_status" | "timeout" | "unreachable" | "blocked";

export interface DeliveryRequest {
	url: string;
	messageId: string;
	body: string;
	secrets: string[];
	/** The webhook's custom headers (validated by lib/webhook-headers.ts); ours win on a clash. */
	headers?: Record<string, string>;
	timeoutMs: number;
}

export interface DeliveryOutcome {
	success: boolean; // true only for HTTP 200
	statusCode: number | null; // what the receiver answered, null if none
	errorKind: DeliveryErrorKind | null;
	title: "HTTP Status Error" | "Timeout" | "Unreachable" | "Blocked" | null;
	detail: string; // short reason in OUR words, never the receiver's body
	durationMs: number;
	responseExcerpt: string | null; // at most 4 KiB of the response body, for the DB only
	attemptedAt: string; // ISO
	/** When a 429/502/503/504 answer's Retry-After asks to be retried (ISO), else null. */
	retryAfter: string | null;
}

export interface WebhookSenderOptions {
	allowNets: string[];
	caFile?: string;
	userAgent?: string;
	connectionsPerOrigin?: number;
}

export const RESPONSE_EXCERPT_BYTES = 4096;
export const DEFAULT_USER_AGENT = `satellite-webhooks/${version}`;

const TITLES = {
	http_status: "HTTP Status Error",
	timeout: "Timeout",
	unreachable: "Unreachable",
	blocked: "Blocked",
} as const;

// The per-attempt deadline (an abort signal) is what normally ends a slow connect; this only
// bounds a socket that keeps trying after its request was abandoned.
const CONNECT_BACKSTOP_MS = 60_000;
const KEEP_ALIVE_MS = 30_000;

/** Raised inside the connector when a destination address is refused. */
class BlockedAddressError extends Error {
	readonly code = "ERR_WEBHOOK_BLOCKED_ADDRESS";
	constructor() {
		super("destination address is in a blocked range");
	}
}

type LookupCallback = (error: NodeJS.ErrnoException | null, address: string | dns.LookupAddress[], family?: number) => void;

type Resolver = (hostname: string, options: dns.LookupAllOptions, callback: (error: NodeJS.ErrnoException | null, addresses: dns.LookupAddress[]) => void) => void;

/**
 * A `lookup` for net/tls.connect that refuses the whole answer when ANY of its addresses is
 * blocked, and otherwise hands net exactly the addresses it checked. Exported for tests.
 */
export function guardedLookup(allow: AllowList, resolve: Resolver = dns.lookup) {
	return (hostname: string, options: dns.LookupOptions, callback: LookupCallback): void => {
		resolve(hostname, { ...options, all: true }, (error, addresses) => {
			if (error) return callback(error, []);
			if (addresses.length === 0) return callback(Object.assign(new Error(`no address for ${hostname}`), { code: "ENOTFOUND" }), []);
			if (addresses.some(entry => isBlockedAddress(entry.address, allow))) return callback(new BlockedAddressError(), []);
			if (options.all) return callback(null, addresses);
			callback(null, addresses[0].address, addresses[0].family);
		});
	};
}

/**
 * A TLS context trusting the public roots plus WEBHOOK_CA_FILE, built once: handing `ca` to
 * every tls.connect would re-parse all the root certificates on each new connection.
 */
function secureContextTrusting(caFile: string | undefined): tls.SecureContext | undefined {
	if (!caFile) return undefined;
	let pem: string;
	try {
		pem = fs.readFileSync(caFile, "utf8");
	} catch (error) {
		throw new Error(`WEBHOOK_CA_FILE: cannot read ${caFile}: ${(error as Error).message}`);
	}
	if (!pem.includes("-----BEGIN CERTIFICATE-----")) throw new Error(`WEBHOOK_CA_FILE: ${caFile} holds no PEM certificate`);
	return tls.createSecureContext({ ca: [...tls.rootCertificates, pem] });
}

/** Walks an error and its causes (AggregateError from Happy Eyeballs included) for a code. */
function errorCodes(error: unknown): string[] {
	const codes: string[] = [];
	const seen = new Set<unknown>();
	const visit = (value: unknown) => {
		if (!value || typeof value !== "object" || seen.has(value)) return;
		seen.add(value);
		const { code, cause, errors } = value as { code?: unknown; cause?: unknown; errors?: unknown };
		if (typeof code === "string") codes.push(code);
		visit(cause);
		if (Array.isArray(errors)) errors.forEach(visit);
	};
	visit(error);
	return codes;
}

const TLS_CODE = /CERT|SSL|TLS|SELF_SIGNED|UNABLE_TO_(GET|VERIFY)|HOSTNAME|ALTNAME/;

/** Our words for a failure that produced no HTTP answer. */
function describeNetworkFailure(error: unknown): { kind: DeliveryErrorKind; detail: string } {
	const codes = errorCodes(error);
	const has = (...wanted: string[]) => codes.some(code => wanted.includes(code));
	if (has("ERR_WEBHOOK_BLOCKED_ADDRESS")) return { kind: "blocked", detail: "The URL's host resolves to an address in a blocked range (private, loopback, link-local or reserved)" };
	if (has("UND_ERR_CONNECT_TIMEOUT", "UND_ERR_HEADERS_TIMEOUT", "UND_ERR_BODY_TIMEOUT", "ETIMEDOUT")) return { kind: "timeout", detail: "No response before the time limit" };
	if (has("ENOTFOUND", "EAI_AGAIN", "EAI_FAIL", "EAI_NONAME", "EAI_NODATA")) return { kind: "unreachable", detail: "The URL's host name could not be resolved" };
	if (has("ECONNREFUSED")) return { kind: "unreachable", detail: "Connection refused" };
	if (has("EHOSTUNREACH", "ENETUNREACH", "EADDRNOTAVAIL")) return { kind: "unreachable", detail: "No route to the host" };
	if (codes.some(code => TLS_CODE.test(code))) return { kind: "unreachable", detail: "TLS handshake failed: the server's certificate is not trusted or does not match the host" };
	if (has("ECONNRESET", "EPIPE", "UND_ERR_SOCKET", "UND_ERR_CLOSED")) return { kind: "unreachable", detail: "The connection was closed before a response arrived" };
	if (codes.some(code => code.startsWith("HPE_")) || has("UND_ERR_HEADERS_OVERFLOW", "UND_ERR_RES_CONTENT_LENGTH_MISMATCH")) return { kind: "unreachable", detail: "The server sent a malformed HTTP response" };
	return { kind: "unreachable", detail: "Could not connect to the URL" };
}

function formatSeconds(ms: number): string {
	return `${Number((ms / 1000).toFixed(3))} s`;
}

/** What came back for one POST, or why nothing did. */
type Exchange = { statusCode: number; retryAfter: string | undefined; excerpt: string } | { error: unknown; timedOut: boolean };

/**
 * One POST through undici's dispatch API, ending at its deadline whatever stage it is in (a
 * request still waiting for its connection then never sends a byte). request() with an
 * AbortController, a Readable body and an async resource per attempt cost a quarter more CPU
 * (50 against 38 µs in `npm run bench -- sender`, where the floor took 36). Keeps at most `limit`
 * bytes of the answer and then drops the rest (and the connection, if more was coming); a body
 * cut short (deadline, reset) still leaves whatever arrived as the excerpt.
 */
class PostExchange implements Dispatcher.DispatchHandler {
	private controller: Dispatcher.DispatchController | null = null;
	private settled = false;
	private statusCode = 0;
	private retryAfter: string | undefined;
	private readonly chunks: Buffer[] = [];
	private size = 0;
	private readonly timer: NodeJS.Timeout;

	constructor(
		private readonly limit: number,
		timeoutMs: number,
		private readonly done: (exchange: Exchange) => void,
	) {
		// A deadline during the body keeps the answer's status and what arrived of the body.
		this.timer = setTimeout(() => (this.statusCode > 0 ? this.answer() : this.settle({ error: null, timedOut: true })), timeoutMs);
	}

	onRequestStart(controller: Dispatcher.DispatchController): void {
		// Past the deadline already (it waited for a connection): abort before a byte is written.
		if (this.settled) controller.abort(new Error("deadline passed before the request was sent"));
		else this.controller = controller;
	}

	onResponseStart(_controller: Dispatcher.DispatchController, statusCode: number, headers: Record<string, string | string[] | undefined>): void {
		this.statusCode = statusCode;
		const retryAfter = headers["retry-after"];
		this.retryAfter = Array.isArray(retryAfter) ? retryAfter[0] : retryAfter;
	}

	onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
		this.chunks.push(chunk);
		this.size += chunk.length;
		if (this.size >= this.limit) this.answer();
	}

	onResponseEnd(): void {
		// Complete: nothing is left to drop. Aborting anyway cost an Error (its stack trace, about
		// 5 µs) per attempt for undici to ignore.
		this.controller = null;
		this.answer();
	}

	onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
		this.fail(error);
	}

	/** The exchange broke: an answer already started keeps its status, else the error is the outcome. */
	fail(error: unknown): void {
		if (this.statusCode > 0) this.answer();
		else this.settle({ error, timedOut: false });
	}

	private answer(): void {
		// PostgreSQL text cannot hold NUL; a cut multi-byte character decodes as U+FFFD.
		const excerpt = Buffer.concat(this.chunks).subarray(0, this.limit).toString("utf8").replaceAll("\u0000", "");
		this.settle({ statusCode: this.statusCode, retryAfter: this.retryAfter, excerpt });
	}

	private settle(exchange: Exchange): void {
		if (this.settled) return;
		this.settled = true;
		clearTimeout(this.timer);
		// Whatever is still coming (a body past the limit, an answer past the deadline) is dropped.
		if (this.controller && !this.controller.aborted) this.controller.abort(new Error("exchange settled"));
		this.done(exchange);
	}
}

// URLs whose policy verdict and dispatch target are remembered (they depend only on the URL and
// the allow list).
const DESTINATIONS_KEPT = 10_000;

type Destination = { refusal: Pick<DeliveryOutcome, "statusCode" | "errorKind" | "detail"> } | { origin: string; path: string };

export class WebhookSender {
	private readonly allow: AllowList;
	private readonly userAgent: string;
	private readonly agent: Agent;
	private readonly destinations = new Map<string, Destination>();
	private opened = 0;

	constructor(options: WebhookSenderOptions) {
		this.allow = parseAllowList(options.allowNets);
		this.userAgent = options.userAgent ?? DEFAULT_USER_AGENT;
		const connectorOptions = {
			secureContext: secureContextTrusting(options.caFile),
			lookup: guardedLookup(this.allow),
			timeout: CONNECT_BACKSTOP_MS,
		} as buildConnector.BuildOptions;
		const sessions = new TlsSessionReuse(() => buildConnector(connectorOptions));
		this.agent = new Agent({
			connections: options.connectionsPerOrigin ?? 8,
			keepAliveTimeout: KEEP_ALIVE_MS,
			connect: (connectOptions, callback) => {
				// Node connects to IP literals without calling lookup: check them here.
				if (isIpLiteral(connectOptions.hostname) && isBlockedAddress(connectOptions.hostname, this.allow)) {
					callback(new BlockedAddressError(), null);
					return;
				}
				sessions.connect(connectOptions, callback);
			},
		});
		this.agent.on("connect", () => (this.opened += 1));
	}

	/**
	 * Connections opened to receivers since the start. Beside the attempts it tells whether
	 * keep-alive works: a receiver that closes its connection after each answer makes every attempt
	 * pay a TLS handshake, several times the rest of an attempt's CPU on both sides.
	 */
	get connectionsOpened(): number {
		return this.opened;
	}

	/**
	 * A rate-limited attempt: made only if it can start by `startBy` (epoch ms, its send time's
	 * deadline), else nothing is sent and the answer is null, which is not an attempt.
	 */
	async sendBy(delivery: DeliveryRequest, startBy: number): Promise<DeliveryOutcome | null> {
		if (Date.now() > startBy) return null;
		return this.send(delivery);
	}

	async send(delivery: DeliveryRequest): Promise<DeliveryOutcome> {
		const attemptedAt = new Date();
		const started = performance.now();
		const finish = (fields: Pick<DeliveryOutcome, "statusCode" | "errorKind" | "detail"> & { responseExcerpt?: string | null; retryAfter?: Date | null }): DeliveryOutcome => ({
			success: fields.statusCode === 200,
			statusCode: fields.statusCode,
			errorKind: fields.errorKind,
			title: fields.errorKind ? TITLES[fields.errorKind] : null,
			detail: fields.detail,
			durationMs: Math.round(performance.now() - started),
			responseExcerpt: fields.responseExcerpt ?? null,
			attemptedAt: attemptedAt.toISOString(),
			retryAfter: fields.retryAfter?.toISOString() ?? null,
		});

		const destination = this.destinationOf(delivery.url);
		if ("refusal" in destination) return finish(destination.refusal);

		// Encoded once: the signature covers exactly the bytes sent.
		const body = Buffer.from(delivery.body, "utf8");
		const headers = {
			...delivery.headers,
			"content-type": "application/json",
			"user-agent": this.userAgent,
			"webhook-id": delivery.messageId,
			"webhook-timestamp": String(unixSeconds(attemptedAt)),
			"webhook-signature": signMessage(delivery.messageId, attemptedAt, body, delivery.secrets),
		};
		const exchange = await new Promise<Exchange>(resolve => {
			const handler = new PostExchange(RESPONSE_EXCERPT_BYTES, delivery.timeoutMs, resolve);
			try {
				this.agent.dispatch({ origin: destination.origin, path: destination.path, method: "POST", headers, body, headersTimeout: delivery.timeoutMs, bodyTimeout: delivery.timeoutMs }, handler);
			} catch (error) {
				handler.fail(error);
			}
		});
		const noAnswerWithin = `No response within ${formatSeconds(delivery.timeoutMs)}`;
		if ("error" in exchange) {
			if (exchange.timedOut) return finish({ statusCode: null, errorKind: "timeout", detail: noAnswerWithin });
			const { kind, detail } = describeNetworkFailure(exchange.error);
			return finish({ statusCode: null, errorKind: kind, detail: kind === "timeout" ? noAnswerWithin : detail });
		}
		const { statusCode, excerpt: responseExcerpt } = exchange;
		if (statusCode === 200) return finish({ statusCode, errorKind: null, detail: "", responseExcerpt });
		const redirect = statusCode >= 300 && statusCode < 400 ? " (redirects are not followed)" : "";
		const retryAfter = RETRY_AFTER_STATUSES.has(statusCode) ? parseRetryAfter(exchange.retryAfter, new Date()) : null;
		return finish({ statusCode, errorKind: "http_status", detail: `The URL answered HTTP ${statusCode}; only 200 counts as delivered${redirect}`, responseExcerpt, retryAfter });
	}

	/** The URL's policy verdict and parts, remembered per URL: parsing it on every attempt showed in profiles. */
	private destinationOf(url: string): Destination {
		let destination = this.destinations.get(url);
		if (destination) return destination;
		destination = this.checkUrl(url);
		if (this.destinations.size >= DESTINATIONS_KEPT) this.destinations.clear();
		this.destinations.set(url, destination);
		return destination;
	}

	/** Scheme, credentials, IP-literal hosts; for a URL that passes, the origin and path to dispatch to. */
	private checkUrl(url: string): Destination {
		let parsed: URL;
		try {
			parsed = new URL(url);
		} catch {
			return { refusal: { statusCode: null, errorKind: "unreachable", detail: "The URL is not a valid absolute URL" } };
		}
		if (parsed.protocol !== "https:") return { refusal: { statusCode: null, errorKind: "blocked", detail: "Only https:// URLs are delivered to" } };
		if (parsed.username || parsed.password) return { refusal: { statusCode: null, errorKind: "blocked", detail: "URLs with credentials are not delivered to" } };
		if (isIpLiteral(parsed.hostname) && isBlockedAddress(parsed.hostname, this.allow)) {
			return { refusal: { statusCode: null, errorKind: "blocked", detail: "The URL's address is in a blocked range (private, loopback, link-local or reserved)" } };
		}
		return { origin: parsed.origin, path: `${parsed.pathname}${parsed.search}` };
	}

	/** Waits for attempts in flight, then closes every pooled connection. */
	async close(): Promise<void> {
		await this.agent.close();
	}
}
