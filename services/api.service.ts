// api: the HTTP gateway (moleculer-web). Owns no table. It authenticates bearer tokens, turns
// every failure into RFC 9457 problem details, enforces the body limit and the rate limits (per
// client address before authentication, per customer after), answers OPTIONS and CORS itself,
// and maps /id/v3 routes to the actions of the services that own the data, each parameter taken
// only from where the route documents it (lib/gateway-policy.ts). Its parts are mixins: the front
// door (mixins/gateway-front-door.ts), the event intake (mixins/gateway-event-intake.ts) and the
// refresh of the caller's user record from the token (mixins/gateway-user-record.ts).
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Context, Service, ServiceSchema, ServiceSettingSchema } from "moleculer";
import ApiGateway from "moleculer-web";
import bodyParser from "body-parser";
import { configOf, type AppConfig } from "../lib/config";
import { createTokenVerifier, AuthenticationError, type TokenVerifier } from "../lib/auth";
import { toProblem, type Problem } from "../lib/errors";
import type { GatewayMeta } from "../lib/gateway-meta";
import { jsonOf } from "../lib/frozen-json";
import { openApiJson } from "../lib/openapi";
import { createRateLimiter, type RateLimiter } from "../lib/rate-limit";
import { GatewayFrontDoor } from "../mixins/gateway-front-door";
import { GatewayUserRecord, type UserRecordMethods, type UserRecordRequest } from "../mixins/gateway-user-record";
import { GatewayEventIntake, PUBLISH_EVENTS_ACTION, PUBLISH_EVENTS_BODY_PARAM, requirePublishScope } from "../mixins/gateway-event-intake";
import { createWebAppHandler } from "../lib/web-app";
import { httpRequestObserver } from "../lib/http-metrics";
import { traceHttpRequest } from "../lib/tracing";
import { checkJsonBody, JsonBodyProblem } from "../lib/json-body";

export const API_BASE = "/id/v3";
// What the two bearer-token routes (the API and the event intake) share: explicit aliases only,
// bodies parsed by their own `use` chain, and body, query and path kept apart (`callAction` builds
// the action's params from them).
const API_ROUTE = { mappingPolicy: "restrict", autoAliases: false, bodyParsers: false, mergeParams: false, callOptions: { timeout: 30_000 } } as const;
const BODY_LIMIT = "64kb";
const METHODS_WITH_BODY = new Set(["POST", "PUT", "PATCH"]);
const RATE_WINDOW_SECONDS = 60;
const UNSUBSCRIBE_LIMIT_PER_ADDRESS = 60;
// Routes answered with CORS headers for the configured origins (the email links are not).
const CORS_PATHS = [API_BASE, "/openapi.json"];

/** Successful statuses other than 200, by action. The services stay free of HTTP details. */
const STATUS_BY_ACTION: Record<string, number> = {
	"webhooks.create": 201,
	"webhooks.remove": 204,
	"dispatcher.retryDelivery": 202,
	"dispatcher.recover": 202,
	[PUBLISH_EVENTS_ACTION]: 202,
};

type GatewayRequest = UserRecordRequest & {
	$ctx: Context<unknown, GatewayMeta>;
	$action?: { name: string };
	body?: unknown;
	originalUrl?: string;
};

type Next = (err?: unknown) => void;

type ApiThis = Service & UserRecordMethods & {
	config: AppConfig;
	verifyToken: TokenVerifier;
	limitAddress: RateLimiter;
	limitCustomer: RateLimiter;
	limitUnsubscribe: RateLimiter;
	observeHttpRequest(req: IncomingMessage, res: ServerResponse): void;
	authenticateRequest(req: GatewayRequest): Promise<void>;
	sendProblem(req: GatewayRequest, res: ServerResponse, err: unknown): void;
};

function bearerToken(req: IncomingMessage): string {
	const header = req.headers.authorization;
	if (!header) throw new AuthenticationError("Missing Authorization header");
	// RFC 7235: the scheme is case-insensitive.
	const match = /^Bearer +([A-Za-z0-9\-_]+\.[A-Za-z0-9\-_]*\.[A-Za-z0-9\-_]*)$/i.exec(header.trim());
	if (!match) throw new AuthenticationError("Authorization header must be 'Bearer <JWT>'");
	return match[1];
}

/** The client's address, for the limit that applies before anyone is authenticated. */
function clientAddress(req: IncomingMessage): string {
	return req.socket.remoteAddress ?? "unknown";
}

function setRateHeaders(res: ServerResponse, budget: { limit: number; remaining: number; resetSeconds: number }): void {
	res.setHeader("RateLimit-Limit", String(budget.limit));
	res.setHeader("RateLimit-Remaining", String(budget.remaining));
	res.setHeader("RateLimit-Reset", String(budget.resetSeconds));
}

function hasBody(req: IncomingMessage): boolean {
	const length = req.headers["content-length"];
	return (length !== undefined && length !== "0") || req.headers["transfer-encoding"] !== undefined;
}

function isJsonContentType(req: IncomingMessage): boolean {
	const type = (req.headers["content-type"] ?? "").split(";")[0].trim().toLowerCase();
	return type === "application/json" || (type.startsWith("application/") && type.endsWith("+json"));
}

/** body-parser's refusal as the problem the client gets. */
function jsonBodyProblem(err: unknown): HttpProblem {
	if (err instanceof JsonBodyProblem) return new HttpProblem(400, err.message);
	const failure = err as { status?: number };
	if (failure.status === 413) return new HttpProblem(413, `The body exceeds the ${BODY_LIMIT} limit`);
	if (failure.status === 415) return new HttpProblem(415, "Unsupported body encoding or charset");
	return new HttpProblem(400, "The body is not valid JSON");
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
	// The front door before moleculer-web: its request handling wraps moleculer-web's. The event
	// intake adds an action only, the user record its methods (`beforeAction` is the front door's hook).
	mixins: [GatewayEventIntake, GatewayUserRecord, GatewayFrontDoor(CORS_PATHS), ApiGateway],

	settings: {
		port: 3000,
		ip: "0.0.0.0",
		// Logged per request by moleculer-web at info level otherwise: too chatty for production.
		logRequest: "debug",
		logResponse: "debug",
		log4XXResponses: false,
		logRequestParams: null,
		logResponseData: null,
		// The request id, decided (and echoed) by the front door (mixins/gateway-front-door.ts),
		// becomes ctx.requestID of every action the request causes, and so of their log lines.
		rootCallOptions(this: ApiThis, options: { requestID?: string; meta?: Record<string, unknown> }, req: IncomingMessage, res: ServerResponse) {
			this.observeHttpRequest(req, res);
			options.requestID = req.headers["x-request-id"] as string;
			// With tracing on: the request's span, handed to the actions it calls in options.meta.
			traceHttpRequest(req, res, options);
		},
		routes: [
			{
				path: API_BASE,
				...API_ROUTE,
				// Filled in `merged`. Order matters: the address limit first (bad tokens count too), then
				// 401 before the principal's limit, then 415 before 413/400, so an unauthenticated caller
				// learns nothing else.
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
					"GET /webhooks/:id/stats": "dispatcher.webhookStats",
					"POST /webhooks/:id/recover": "dispatcher.recover",
					"GET /user/details": "users.details",
					"PUT /user/settings": "users.updateSettings",
				},
				onBeforeCall(this: ApiThis, ctx: Context<unknown, GatewayMeta>, _route: unknown, req: GatewayRequest) {
					const ifMatch = req.headers["if-match"];
					if (typeof ifMatch === "string") ctx.meta.ifMatch = ifMatch;
				},
				async onAfterCall(this: ApiThis, ctx: Context<unknown, GatewayMeta>, _route: unknown, req: GatewayRequest, res: ServerResponse, data: unknown) {
					await this.refreshUserAfterSuccess(ctx, req);
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
				// Producers outside the broker post order events here (mixins/gateway-event-intake.ts).
				// A route of its own because its body is one event or a list, and its token needs a scope.
				path: `${API_BASE}/events`,
				...API_ROUTE,
				// Filled in `merged`: the same limits and authentication as the route above.
				use: [],
				aliases: {
					"POST /tasking.order_status": PUBLISH_EVENTS_ACTION,
				},
				onAfterCall(this: ApiThis, ctx: Context<unknown, GatewayMeta>, _route: unknown, _req: GatewayRequest, _res: ServerResponse, data: unknown) {
					ctx.meta.$statusCode = STATUS_BY_ACTION[PUBLISH_EVENTS_ACTION];
					return data;
				},
			},
			{
				// RFC 8058 one-click unsubscribe links from notification emails. No bearer token:
				// the signed, expiring token in the link is the credential.
				path: "/email",
				mappingPolicy: "restrict",
				autoAliases: false,
				bodyParsers: { json: false, urlencoded: { extended: false, limit: "4kb" } },
				mergeParams: false,
				aliases: {
					"GET /unsubscribe": "notifier.unsubscribePage",
					"POST /unsubscribe": "notifier.unsubscribe",
				},
				// Filled in `merged`: a per-address limit.
				use: [],
			},
			{
				// The OpenAPI 3.1 document (lib/openapi/). Public, like any API reference.
				path: "/openapi.json",
				mappingPolicy: "restrict",
				autoAliases: false,
				bodyParsers: false,
				mergeParams: false,
				aliases: {
					"GET /"(this: ApiThis, _req: IncomingMessage, res: ServerResponse) {
						res.setHeader("Content-Type", "application/json; charset=utf-8");
						res.setHeader("Cache-Control", "public, max-age=300");
						res.end(openApiJson(this.config.PUBLIC_BASE_URL));
					},
				},
			},
			{
				// The web application at / and its GET /config.json (lib/web-app.ts). Routes are
				// matched deepest first, so this one only sees what no other route claims.
				path: "/",
				mappingPolicy: "restrict",
				autoAliases: false,
				bodyParsers: false,
				aliases: {},
				use: [],
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
		},

		/** moleculer-web's JSON encoding of an answer, done only once for one a service keeps frozen. */
		encodeResponse(this: ApiThis, _req: IncomingMessage, _res: ServerResponse, data: unknown): string {
			return jsonOf(data);
		},

		sendProblem(this: ApiThis, req: GatewayRequest, res: ServerResponse, err: unknown): void {
			const problem: Problem = toProblem(err);
			if (problem.status >= 500) {
				// The path only: a query string can carry a credential (the unsubscribe links' token).
				this.logger.error(`${req.method} ${(req.originalUrl ?? req.url ?? "").split("?")[0]} failed`, err);
			}
			if (res.headersSent) return;
			res.statusCode = problem.status;
			res.setHeader("Content-Type", "application/problem+json");
			if (problem.status === 401) res.setHeader("WWW-Authenticate", 'Bearer realm="id/v3"');
			if (problem.status === 429) res.setHeader("Retry-After", String((err as { retryAfterSeconds?: number }).retryAfterSeconds ?? 60));
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
			routes: Array<{ path: string; use?: unknown[] }>;
		};
		settings.port = config.PORT;
		settings.ip = config.HOST;
		settings.routes.find(webApp => webApp.path === "/")!.use = [createWebAppHandler(config)];
		const route = settings.routes[0];
		const emailRoute = settings.routes.find(candidate => candidate.path === "/email")!;
		emailRoute.use = [
			(req: GatewayRequest, _res: ServerResponse, next: Next) => {
				this.limitUnsubscribe(clientAddress(req)).then(() => next(), next);
			},
		];
		// Not strict: a JSON string or number is valid JSON, so it gets the 422 below, not a 400.
		const jsonParser = bodyParser.json({ limit: BODY_LIMIT, strict: false, type: () => true, verify: (_req, _res, bytes) => checkJsonBody(bytes) });
		const limitByAddress = (req: GatewayRequest, _res: ServerResponse, next: Next) => {
			this.limitAddress(clientAddress(req)).then(() => next(), next);
		};
		const authenticate = (req: GatewayRequest, _res: ServerResponse, next: Next) => {
			this.authenticateRequest(req).then(() => next(), next);
		};
		// Per customer, not per token or user: another token, another encoding of it, or another
		// user of the same customer shares the customer's budget, so adding users buys no more.
		const limitByCustomer = (req: GatewayRequest, res: ServerResponse, next: Next) => {
			this.limitCustomer(req.$ctx.meta.customerId!).then(budget => {
				setRateHeaders(res, budget);
				next();
			}, next);
		};
		// The event intake: 403 before the body is read, then one event or a list, handed to the
		// action whole (an array has no fields to spread into params).
		const eventsRoute = settings.routes.find(candidate => candidate.path === `${API_BASE}/events`)!;
		eventsRoute.use = [
			limitByAddress,
			authenticate,
			limitByCustomer,
			(req: GatewayRequest, _res: ServerResponse, next: Next) => {
				try {
					requirePublishScope(req.$ctx.meta.principal);
					next();
				} catch (err) {
					next(err);
				}
			},
			(req: GatewayRequest, res: ServerResponse, next: Next) => {
				if (!hasBody(req)) return next();
				if (!isJsonContentType(req)) return next(new HttpProblem(415, "Send the body as JSON with Content-Type: application/json"));
				jsonParser(req, res, err => {
					if (err) return next(jsonBodyProblem(err));
					req.body = { [PUBLISH_EVENTS_BODY_PARAM]: req.body };
					next();
				});
			},
		];
		route.use = [
			limitByAddress,
			authenticate,
			limitByCustomer,
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
					return next(jsonBodyProblem(err));
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
		const perMinute = this.config.RATE_LIMIT_PER_MINUTE;
		this.limitCustomer = createRateLimiter(perMinute, RATE_WINDOW_SECONDS);
		this.limitAddress = createRateLimiter(this.config.RATE_LIMIT_PER_ADDRESS_PER_MINUTE ?? 2 * perMinute, RATE_WINDOW_SECONDS);
		this.limitUnsubscribe = createRateLimiter(UNSUBSCRIBE_LIMIT_PER_ADDRESS, RATE_WINDOW_SECONDS);
		this.observeHttpRequest = httpRequestObserver(this.broker);
	},
};

export default ApiService;
