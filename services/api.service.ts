// api: the HTTP gateway (moleculer-web). Owns no table. It authenticates bearer tokens, turns
// every failure into RFC 9457 problem details, enforces the body limit and the per-token rate
// limit, and maps /id/v3 routes to the actions of the services that own the data.
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Context, Service, ServiceSchema, ServiceSettingSchema } from "moleculer";
import ApiGateway from "moleculer-web";
import bodyParser from "body-parser";
import { configOf, type AppConfig } from "../lib/config";
import { createTokenVerifier, AuthenticationError, type Principal, type TokenVerifier } from "../lib/auth";
import { toProblem, type Problem } from "../lib/errors";
import { openApiJson } from "../lib/openapi";

export const API_BASE = "/id/v3";
const BODY_LIMIT = "64kb";
const METHODS_WITH_BODY = new Set(["POST", "PUT", "PATCH"]);
// Refreshing the user record on every request would cost a write each time: remember what we
// last sent to `users.touch` and skip identical claims for a while.
const TOUCH_CACHE_TTL_MS = 60_000;
const TOUCH_CACHE_MAX = 10_000;

/** Successful statuses other than 200, by action. The services stay free of HTTP details. */
const STATUS_BY_ACTION: Record<string, number> = {
	"webhooks.create": 201,
	"webhooks.remove": 204,
	"dispatcher.retryDelivery": 202,
	"dispatcher.recover": 202,
};

type GatewayRequest = IncomingMessage & {
	$ctx: Context<unknown, GatewayMeta>;
	$action?: { name: string };
	body?: unknown;
	originalUrl?: string;
};
type Next = (err?: unknown) => void;

export interface GatewayMeta {
	userId?: string;
	customerId?: string;
	principal?: Principal;
	ifMatch?: string;
	etag?: string;
	$statusCode?: number;
	$location?: string;
	$responseHeaders?: Record<string, string>;
	$responseType?: string;
}

type ApiThis = Service & {
	config: AppConfig;
	verifyToken: TokenVerifier;
	touchedUsers: Map<string, { fingerprint: string; at: number }>;
	authenticateRequest(req: GatewayRequest): Promise<void>;
	touchUser(ctx: Context, principal: Principal): Promise<void>;
	sendProblem(req: GatewayRequest, res: ServerResponse, err: unknown): void;
};

function bearerToken(req: IncomingMessage): string {
	const header = req.headers.authorization;
	if (!header) throw new AuthenticationError("Missing Authorization header");
	const match = /^Bearer ([A-Za-z0-9\-_]+\.[A-Za-z0-9\-_]*\.[A-Za-z0-9\-_]*)$/.exec(header.trim());
	if (!match) throw new AuthenticationError("Authorization header must be 'Bearer <JWT>'");
	return match[1];
}

function hasBody(req: IncomingMessage): boolean {
	const length = req.headers["content-length"];
	return (length !== undefined && length !== "0") || req.headers["transfer-encoding"] !== undefined;
}

function isJsonContentType(req: IncomingMessage): boolean {
	const type = (req.headers["content-type"] ?? "").split(";")[0].trim().toLowerCase();
	return type === "application/json" || (type.startsWith("application/") && type.endsWith("+json"));
}

class HttpProblem extends Error {
	constructor(
		readonly code: number,
		message: string,
		readonly type?: string,
	) {
		super(message);
	}
}

const ApiService: ServiceSchema<ServiceSettingSchema, ApiThis> = {
	name: "api",
	mixins: [ApiGateway],

	settings: {
		port: 3000,
		ip: "0.0.0.0",
		// Logged per request by moleculer-web at info level otherwise: too chatty for production.
		logRequest: "debug",
		logResponse: "debug",
		log4XXResponses: false,
		logRequestParams: null,
		logResponseData: null,
		routes: [
			{
				path: API_BASE,
				mappingPolicy: "restrict",
				autoAliases: false,
				bodyParsers: false,
				// Filled in `merged`. Order matters: 401 before 415 before 413/400, so an unauthenticated
				// caller learns nothing else.
				use: [],
				aliases: {
					"GET /webhooks/events": "topics.webhookTopics",
					"GET /webhooks": "webhooks.list",
					"POST /webhooks": "webhooks.create",
					"GET /webhooks/:id": "webhooks.get",
					"PATCH /webhooks/:id": "webhooks.update",
					"DELETE /webhooks/:id": "webhooks.remove",
					"POST /webhooks/:id/rotate": "webhooks.rotate",
					"POST /webhooks/:id/test": "dispatcher.testWebhook",
					"GET /webhooks/:id/deliveries": "dispatcher.listDeliveries",
					"GET /webhooks/:id/deliveries/:delivery_id": "dispatcher.getDelivery",
					"POST /webhooks/:id/deliveries/:delivery_id/retry": "dispatcher.retryDelivery",
					"POST /webhooks/:id/recover": "dispatcher.recover",
					"GET /user/details": "users.details",
					"PUT /user/settings": "users.updateSettings",
				},
				rateLimit: {
					window: 60_000,
					limit: 600,
					headers: true,
					key: (req: IncomingMessage) => req.headers.authorization ?? req.socket.remoteAddress ?? "anonymous",
				},
				callOptions: { timeout: 30_000 },
				onBeforeCall(this: ApiThis, ctx: Context<unknown, GatewayMeta>, _route: unknown, req: GatewayRequest) {
					const ifMatch = req.headers["if-match"];
					if (typeof ifMatch === "string") ctx.meta.ifMatch = ifMatch;
				},
				onAfterCall(this: ApiThis, ctx: Context<unknown, GatewayMeta>, _route: unknown, req: GatewayRequest, res: ServerResponse, data: unknown) {
					const status = req.$action ? STATUS_BY_ACTION[req.$action.name] : undefined;
					if (status) ctx.meta.$statusCode = status;
					if (status === 201 && data && typeof data === "object" && "id" in data) {
						ctx.meta.$location = `${API_BASE}/webhooks/${(data as { id: string }).id}`;
					}
					if (ctx.meta.etag) res.setHeader("ETag", ctx.meta.etag);
					return status === 204 ? null : data;
				},
			},
			{
				// RFC 8058 one-click unsubscribe links from notification emails. No bearer token:
				// the signed, expiring token in the link is the credential.
				path: "/email",
				mappingPolicy: "restrict",
				autoAliases: false,
				bodyParsers: { json: false, urlencoded: { extended: false, limit: "4kb" } },
				aliases: {
					"GET /unsubscribe": "notifier.unsubscribePage",
					"POST /unsubscribe": "notifier.unsubscribe",
				},
				rateLimit: {
					window: 60_000,
					limit: 60,
					headers: true,
					key: (req: IncomingMessage) => req.socket.remoteAddress ?? "anonymous",
				},
			},
			{
				// The OpenAPI 3.1 document (lib/openapi.ts). Public, like any API reference.
				path: "/openapi.json",
				mappingPolicy: "restrict",
				autoAliases: false,
				bodyParsers: false,
				aliases: {
					"GET /"(this: ApiThis, _req: IncomingMessage, res: ServerResponse) {
						res.setHeader("Content-Type", "application/json; charset=utf-8");
						res.setHeader("Cache-Control", "public, max-age=300");
						res.end(openApiJson(this.config.PUBLIC_BASE_URL));
					},
				},
			},
		],
		onError(this: ApiThis, req: GatewayRequest, res: ServerResponse, err: unknown) {
			this.sendProblem(req, res, err);
		},
	},

	methods: {
		async authenticateRequest(this: ApiThis, req: GatewayRequest): Promise<void> {
			const principal = await this.verifyToken(bearerToken(req));
			const ctx = req.$ctx;
			ctx.meta.principal = principal;
			ctx.meta.userId = principal.userId;
			ctx.meta.customerId = principal.customerId;
			await this.touchUser(ctx, principal);
		},

		async touchUser(this: ApiThis, ctx: Context, principal: Principal): Promise<void> {
			const fingerprint = JSON.stringify([principal.customerId, principal.name, principal.email, principal.lastLogin]);
			const seen = this.touchedUsers.get(principal.userId);
			const now = Date.now();
			if (seen && seen.fingerprint === fingerprint && now - seen.at < TOUCH_CACHE_TTL_MS) return;
			try {
				await ctx.call("users.touch", principal);
			} catch (err) {
				// Without a users service the API still serves webhooks; user routes will answer 503.
				if ((err as Error).name !== "ServiceNotFoundError") throw err;
				return;
			}
			if (this.touchedUsers.size >= TOUCH_CACHE_MAX) this.touchedUsers.clear();
			this.touchedUsers.set(principal.userId, { fingerprint, at: now });
		},

		sendProblem(this: ApiThis, req: GatewayRequest, res: ServerResponse, err: unknown): void {
			const problem: Problem = toProblem(err);
			if (problem.status >= 500) {
				this.logger.error(`${req.method} ${req.originalUrl ?? req.url} failed`, err);
			}
			if (res.headersSent) return;
			res.statusCode = problem.status;
			res.setHeader("Content-Type", "application/problem+json");
			if (problem.status === 401) res.setHeader("WWW-Authenticate", 'Bearer realm="id/v3"');
			if (problem.status === 429) res.setHeader("Retry-After", String(Math.ceil(60)));
			if (problem.status === 503) res.setHeader("Retry-After", "5");
			res.end(JSON.stringify(problem));
		},
	},

	// moleculer-web builds its routes in its own `created` hook, so configuration has to be
	// applied to the merged schema, before that runs.
	merged(this: ApiThis, schema: ServiceSchema) {
		const config = configOf(this.broker);
		const settings = schema.settings as {
			port: number;
			ip: string;
			routes: Array<{ rateLimit: { limit: number }; use: unknown[] }>;
		};
		settings.port = config.PORT;
		settings.ip = config.HOST;
		const route = settings.routes[0];
		route.rateLimit.limit = config.RATE_LIMIT_PER_MINUTE;
		// Not strict: a JSON string or number is valid JSON, so it gets the 422 below, not a 400.
		const jsonParser = bodyParser.json({ limit: BODY_LIMIT, strict: false, type: () => true });
		route.use = [
			(req: GatewayRequest, _res: ServerResponse, next: Next) => {
				this.authenticateRequest(req).then(() => next(), next);
			},
			(req: GatewayRequest, res: ServerResponse, next: Next) => {
				if (!METHODS_WITH_BODY.has(req.method ?? "") || !hasBody(req)) return next();
				if (!isJsonContentType(req)) return next(new HttpProblem(415, "Send the body as JSON with Content-Type: application/json"));
				jsonParser(req, res, err => {
					if (!err) {
						const body = req.body;
						// `null`, strings, numbers and arrays are valid JSON but not a request object.
						if (typeof body !== "object" || body === null || Array.isArray(body)) {
							return next(new HttpProblem(422, "The body must be a JSON object", "validation-error"));
						}
						return next();
					}
					const failure = err as { status?: number };
					if (failure.status === 413) return next(new HttpProblem(413, `The body exceeds the ${BODY_LIMIT} limit`));
					if (failure.status === 415) return next(new HttpProblem(415, "Unsupported body encoding or charset"));
					return next(new HttpProblem(400, "The body is not valid JSON"));
				});
			},
		];
	},

	created(this: ApiThis) {
		// Every alias is declared explicitly (autoAliases: false), so moleculer-web's debounced
		// alias regeneration on each service change has nothing to do, and its timer would only
		// fire after shutdown.
		(this as unknown as { regenerateAllAutoAliases: () => void }).regenerateAllAutoAliases = () => undefined;
		this.config = configOf(this.broker);
		this.verifyToken = createTokenVerifier(this.config);
		this.touchedUsers = new Map();
	},
};

export default ApiService;
