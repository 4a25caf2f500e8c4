// The gateway's front door, mixed into the api service ahead of moleculer-web: what happens to a
// request before moleculer-web routes it, and how an action's params are built. OPTIONS is
// answered here and never routed (moleculer-web would run the action named by
// Access-Control-Request-Method); HEAD is GET without a body; a known path with another method
// gets 405; CORS comes from CORS_ORIGINS; the query string is plain strings; params come only from
// where the operation documents them (lib/gateway-policy.ts); bytes that are not HTTP get a
// problem+json 400, and the request before them on the connection does nothing; so does framing
// the gateway cannot trust (an unknown Transfer-Encoding, no Host, a repeated Authorization),
// with the connection closed. Slow clients meet HTTP_HEADERS_TIMEOUT and HTTP_REQUEST_TIMEOUT,
// and one address holds at most HTTP_CONNECTIONS_PER_ADDRESS connections.
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import type { Context, Service, ServiceSchema, ServiceSettingSchema } from "moleculer";
import ApiGateway from "moleculer-web";
import { configOf, type AppConfig } from "../lib/config";
import { ClientProblem, toProblem } from "../lib/errors";
import { queryParametersByAction } from "../lib/openapi";
import {
	actionParams,
	framingProblem,
	CORS_ALLOWED_HEADERS,
	CORS_EXPOSED_HEADERS,
	CORS_MAX_AGE_SECONDS,
	originAllowed,
	parseQuery,
	requestIdFrom,
	type RequestParts,
} from "../lib/gateway-policy";

// moleculer-web's own handlers, which this mixin wraps.
const Gateway = ApiGateway as unknown as { methods: Record<string, (this: unknown, ...args: unknown[]) => unknown> };

export type FrontDoorRequest = IncomingMessage & {
	$ctx: Context<unknown, object>;
	originalUrl?: string;
	/** Set when the connection carried malformed bytes after this request: it must not act. */
	$malformedConnection?: boolean;
};

interface GatewayAlias {
	method: string;
	match(url: string): unknown;
}
type Next = (err?: unknown) => void;

type FrontDoorThis = Service & {
	config: AppConfig;
	server?: Server;
	aliases: GatewayAlias[];
	queryParameters: Map<string, string[]>;
	corsPaths: string[];
	/** Provided by the service: writes a problem+json answer. */
	sendProblem(req: FrontDoorRequest, res: ServerResponse, err: unknown): void;
	/** Optional, from the service or another of its mixins (gateway-user-record.ts): runs once the gateway has accepted the request, right before its action. */
	beforeAction?(req: FrontDoorRequest, actionName: string, params: Record<string, unknown>): Promise<void>;
	methodsAllowed(url: string): string[];
	answerOptions(req: IncomingMessage, res: ServerResponse, url: string): void;
	writeCorsHeaders(req: IncomingMessage, res: ServerResponse): void;
	answerClientError(err: NodeJS.ErrnoException, socket: Socket): void;
	limitConnections(socket: Socket): void;
	connectionsByAddress: Map<string, number>;
	refusedSockets: WeakSet<Socket>;
};

/** A whole problem+json answer as bytes, for a socket no ServerResponse writes to. */
function rawProblemAnswer(status: number, detail: string, extraHeaders = ""): string {
	const problem = toProblem(new ClientProblem(status, "invalid-request", detail));
	const body = JSON.stringify(problem);
	return (
		`HTTP/1.1 ${status} ${problem.title}\r\nContent-Type: application/problem+json\r\nX-Content-Type-Options: nosniff\r\n` +
		`Cache-Control: no-store\r\n${extraHeaders}Connection: close\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
	);
}

/** The path without query string or trailing slash, as moleculer-web matches aliases. */
function routedPath(url: string): string {
	const path = url.split("?", 1)[0];
	return path.length > 1 && path.endsWith("/") ? path.slice(0, -1) : path;
}

/** `corsPaths`: the path prefixes answered with CORS headers for the configured origins. */
export function GatewayFrontDoor(corsPaths: string[]): Partial<ServiceSchema> {
	const schema: Partial<ServiceSchema<ServiceSettingSchema, FrontDoorThis>> = {
		methods: {
			/**
			 * Every request passes here first. OPTIONS is answered here and never routed (moleculer-web
			 * would run the action named by Access-Control-Request-Method), a known path with another
			 * method gets 405, and every answer gets the request id and the security headers.
			 */
			httpHandler(this: FrontDoorThis, req: FrontDoorRequest, res: ServerResponse, next?: Next) {
				const requestId = requestIdFrom(req.headers["x-correlation-id"] ?? req.headers["x-request-id"]);
				req.headers["x-request-id"] = requestId;
				delete req.headers["x-correlation-id"];
				res.setHeader("X-Request-Id", requestId);
				res.setHeader("X-Content-Type-Options", "nosniff");
				// Create and rotate answer with a secret; nothing the API answers belongs in a cache.
				res.setHeader("Cache-Control", "no-store");
				// A connection over the per-address cap was answered already: its requests do nothing.
				if (this.refusedSockets.has(req.socket)) return void res.destroy();
				const framing = framingProblem(req);
				if (framing) {
					// What follows on this connection cannot be told apart from this request's body.
					this.refusedSockets.add(req.socket);
					res.setHeader("Connection", "close");
					return this.sendProblem(req, res, new ClientProblem(400, "invalid-request", framing));
				}
				const url = routedPath(req.url ?? "/");
				if (this.corsPaths.some(prefix => url === prefix || url.startsWith(`${prefix}/`))) this.writeCorsHeaders(req, res);
				if (req.method === "OPTIONS") return this.answerOptions(req, res, url);
				const allowed = this.methodsAllowed(url);
				if (allowed.length && !allowed.includes(req.method ?? "")) {
					res.setHeader("Allow", allowed.join(", "));
					return this.sendProblem(req, res, new ClientProblem(405, "method-not-allowed", `${req.method} is not allowed here: use ${allowed.join(", ")}`));
				}
				return Gateway.methods.httpHandler.call(this, req, res, next);
			},

			/** HEAD is GET without the body (moleculer-web skips the body of a HEAD answer). */
			resolveAlias(this: FrontDoorThis, url: string, method = "GET") {
				return Gateway.methods.resolveAlias.call(this, url, method === "HEAD" ? "GET" : method);
			},

			/** Plain strings only: no nested objects, arrays from "name[]" or prototype keys. */
			parseQueryString(this: FrontDoorThis, req: IncomingMessage) {
				const url = req.url ?? "/";
				const mark = url.indexOf("?", 1);
				return mark === -1 ? { url, query: parseQuery("") } : { url: url.slice(0, mark), query: parseQuery(url.slice(mark + 1)) };
			},

			/** Builds the action's params from where each may come from (lib/gateway-policy.ts). */
			async callAction(this: FrontDoorThis, route: unknown, actionName: string, req: FrontDoorRequest, res: ServerResponse, parts: RequestParts & { params?: Record<string, string> }) {
				const params = actionParams({ body: parts.body, query: parts.query, path: parts.params }, this.queryParameters.get(actionName) ?? []);
				await this.beforeAction?.(req, actionName, params);
				if (req.$malformedConnection) throw new ClientProblem(400, "invalid-request", "The connection carried malformed data after this request: nothing was done");
				return Gateway.methods.callAction.call(this, route, actionName, req, res, params);
			},

			/** The methods the aliases accept on this path (HEAD wherever GET is); empty for an unknown path. */
			methodsAllowed(this: FrontDoorThis, url: string): string[] {
				const methods = new Set(this.aliases.filter(alias => alias.match(url)).map(alias => alias.method));
				if (methods.size === 0) return [];
				if (methods.has("GET")) methods.add("HEAD");
				methods.add("OPTIONS");
				return [...methods];
			},

			/**
			 * A CORS preflight from a configured origin gets what it may do; any other OPTIONS gets
			 * 204 with Allow (a browser then refuses the cross-origin call). Nothing is ever called.
			 */
			answerOptions(this: FrontDoorThis, req: IncomingMessage, res: ServerResponse, url: string): void {
				const allowed = this.methodsAllowed(url);
				if (allowed.length === 0) return this.sendProblem(req as FrontDoorRequest, res, new ClientProblem(404, "not-found", "Not found"));
				res.setHeader("Allow", allowed.join(", "));
				const requested = req.headers["access-control-request-method"];
				const preflight = typeof requested === "string" && res.hasHeader("Access-Control-Allow-Origin");
				if (preflight && allowed.includes(requested)) {
					res.setHeader("Access-Control-Allow-Methods", allowed.join(", "));
					res.setHeader("Access-Control-Allow-Headers", CORS_ALLOWED_HEADERS.join(", "));
					res.setHeader("Access-Control-Max-Age", String(CORS_MAX_AGE_SECONDS));
				}
				res.appendHeader("Vary", "Access-Control-Request-Method, Access-Control-Request-Headers");
				res.writeHead(204);
				res.end();
			},

			writeCorsHeaders(this: FrontDoorThis, req: IncomingMessage, res: ServerResponse): void {
				res.setHeader("Vary", "Origin");
				const origin = req.headers.origin;
				if (!originAllowed(origin, this.config.CORS_ORIGINS)) return;
				res.setHeader("Access-Control-Allow-Origin", origin);
				res.setHeader("Access-Control-Expose-Headers", CORS_EXPOSED_HEADERS.join(", "));
			},

			/**
			 * Bytes that do not parse as HTTP (e.g. junk after a `Content-Length: 0` request) get a
			 * problem+json 400 and the connection is closed. A request already read from the same
			 * connection is marked so that it does nothing, and answered before the 400.
			 */
			answerClientError(this: FrontDoorThis, err: NodeJS.ErrnoException, socket: Socket): void {
				if (err.code === "ECONNRESET" || !socket.writable) return void socket.destroy();
				const [status, detail] =
					err.code === "HPE_HEADER_OVERFLOW"
						? [431, "The request headers are too large"]
						: err.code === "ERR_HTTP_REQUEST_TIMEOUT"
							? [408, "The request was not received in time"]
							: [400, "The request is not valid HTTP"];
				let answered = false;
				const answer = () => {
					if (answered) return;
					answered = true;
					// A connection already answered and closing (bad framing, over the cap) gets nothing more.
					if (!socket.writable || this.refusedSockets.has(socket)) return void socket.destroy();
					socket.end(rawProblemAnswer(status, detail));
				};
				const pending = (socket as Socket & { _httpMessage?: ServerResponse & { req?: FrontDoorRequest } })._httpMessage;
				if (pending && !pending.writableFinished) {
					if (pending.req) pending.req.$malformedConnection = true;
					pending.once("finish", answer);
					pending.once("close", answer);
				} else answer();
			},

			/**
			 * Counts each client address's open connections; one past HTTP_CONNECTIONS_PER_ADDRESS is
			 * answered 429 and closed, and whatever it sends meanwhile does nothing.
			 */
			limitConnections(this: FrontDoorThis, socket: Socket): void {
				const cap = this.config.HTTP_CONNECTIONS_PER_ADDRESS;
				if (cap === 0) return;
				const address = socket.remoteAddress ?? "unknown";
				const open = (this.connectionsByAddress.get(address) ?? 0) + 1;
				if (open > cap) {
					this.refusedSockets.add(socket);
					socket.on("error", () => socket.destroy());
					socket.end(rawProblemAnswer(429, `Too many open connections from this address (at most ${cap}): close some and try again`, "Retry-After: 1\r\n"));
					return;
				}
				this.connectionsByAddress.set(address, open);
				socket.once("close", () => {
					const left = (this.connectionsByAddress.get(address) ?? 1) - 1;
					if (left > 0) this.connectionsByAddress.set(address, left);
					else this.connectionsByAddress.delete(address);
				});
			},
		},

		created(this: FrontDoorThis) {
			this.corsPaths = corsPaths;
			this.queryParameters = queryParametersByAction();
			this.connectionsByAddress = new Map();
			this.refusedSockets = new WeakSet();
			// Both are read by Node on each request (and when listening starts); @types/node omits them.
			const server = this.server as (Server & { connectionsCheckingInterval: number; requireHostHeader: boolean }) | undefined;
			if (!server) return;
			// The service's own created hook, which sets this.config, runs after this one.
			const config = configOf(this.broker);
			// Slow headers or a slow body must not hold a connection: Node's defaults (60 s for the
			// headers, 300 s for the request, checked every 30 s) let one held for over a minute.
			server.headersTimeout = config.HTTP_HEADERS_TIMEOUT;
			server.requestTimeout = Math.max(config.HTTP_REQUEST_TIMEOUT, config.HTTP_HEADERS_TIMEOUT);
			server.connectionsCheckingInterval = Math.min(1_000, config.HTTP_HEADERS_TIMEOUT);
			// Answered by the front door with problem details rather than Node's bare 400.
			server.requireHostHeader = false;
			server.on("connection", (socket: Socket) => this.limitConnections(socket));
			server.on("clientError", (err: NodeJS.ErrnoException, socket: Socket) => this.answerClientError(err, socket));
		},
	};
	return schema as Partial<ServiceSchema>;
}
