// Configuration: environment variables validated with zod at startup. Bad or missing values stop
// startup with one message that names every one of them, so that an operator fixes them all in
// one go. In the embedded default, missing secrets are generated once into DATA_DIR so that
// `npm start` needs no set-up; in production they, and the notifier's mail settings, are required.
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";
import { z } from "zod";
import type { ServiceBroker } from "moleculer";
import { base64Key32, cidrList, csv, duration, httpUrl, isSmtpServer, natsCredsFile, natsServerList, originList, otlpEndpoint, otlpProtocol, pemFile, pemKeyFile, port, positiveInt, postgresUrl, schedule, wholeNumber } from "./config-fields";
import { natsUrlWithCredentials } from "./connection-urls";
import { senderDomain } from "./email-message";

/**
 * The SMTP_URL that asks for .eml files, e.g. in production without a mail server. Kept here, not
 * in lib/mail-transport.ts, so that reading the configuration does not load nodemailer in every
 * process: only the notifier sends mail.
 */
export const MAIL_TO_FILES = "file:";

export const TRACE_SAMPLERS = ["always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"] as const;

const NATS_FILE_VARIABLES = ["NATS_CA_FILE", "NATS_CERT_FILE", "NATS_KEY_FILE", "NATS_CREDS_FILE"] as const;

/** The NODE_ENV values that say what they mean; any other runs as development, with a warning. */
const KNOWN_NODE_ENVS = ["development", "production", "test"];

export const ALL_SERVICES = ["api", "topics", "webhooks", "users", "dispatcher", "notifier"] as const;
export type ServiceName = (typeof ALL_SERVICES)[number];

// Exported so that a test can hold the table of docs/configuration.md to exactly these variables.
export const EnvSchema = z.object({
	NODE_ENV: z.string().default("development"),
	PORT: port(3000),
	OPS_PORT: port(3030),
	// Unset: loopback in development (generated secrets stay on this machine), every interface
	// in production and in the image.
	HOST: z.string().optional(),
	DATA_DIR: z.string().default("./data"),
	DATABASE_URL: postgresUrl.optional(),
	DATABASE_SCHEMA: z
		.string()
		.regex(/^[a-z_][a-z0-9_]{0,62}$/, "must be a lower-case SQL identifier")
		.optional(),
	TRANSPORTER: natsServerList.optional(),
	// TLS to NATS (lib/connection-urls.ts): a CA added to the public roots for a server whose
	// certificate a private CA signed, and this node's own certificate for a server that verifies
	// its clients. Either one demands TLS, as tls:// does.
	NATS_CA_FILE: pemFile.optional(),
	NATS_CERT_FILE: pemFile.optional(),
	NATS_KEY_FILE: pemKeyFile.optional(),
	// Decentralized auth (JWT): the user's credentials as `nsc` or a NATS cloud hands them out.
	NATS_CREDS_FILE: natsCredsFile.optional(),
	// A NATS subject token and part of JetStream's stream names: a space, "*", ">" or "/" there made
	// the intake's provisioning fail at start-up with a message that named no variable.
	NAMESPACE: z
		.string()
		.regex(/^$|^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$/, "must be letters, digits, - and _, in parts joined by single dots")
		.max(64, "must be at most 64 characters")
		.default(""),
	// How long JetStream waits for a consumer's acknowledgement before handing the event to another
	// instance of its group. Applied when a node provisions the intake (see lib/intake-jetstream.ts).
	INTAKE_ACK_WAIT: duration("60s"),
	NODE_ID: z.string().optional(),
	SERVICES: z
		.string()
		.default("all")
		.transform((text, ctx) => {
			const names = text
				.split(",")
				.map(part => part.trim())
				.filter(Boolean);
			if (names.length === 0 || names.includes("all")) return [...ALL_SERVICES];
			const unknown = names.filter(name => !(ALL_SERVICES as readonly string[]).includes(name));
			if (unknown.length) {
				ctx.addIssue({ code: "custom", message: `unknown service(s) ${unknown.join(", ")}; known: ${ALL_SERVICES.join(", ")}` });
				return z.NEVER;
			}
			return names as ServiceName[];
		}),
	LOG_LEVEL: z.enum(["fatal", "error", "warn", "info", "debug", "trace"]).default("info"),

	AUTH_JWT_SECRET: z.string().min(32, "must be at least 32 characters").optional(),
	AUTH_JWKS_URL: httpUrl.optional(),
	AUTH_ISSUER: z.string().optional(),
	AUTH_AUDIENCE: z.string().optional(),
	AUTH_ALGORITHMS: csv,
	AUTH_CUSTOMER_CLAIM: z.string().default("customer_id"),
	AUTH_CLOCK_SKEW: duration("60s"),
	// Refuses tokens without the customer claim, so that every caller belongs to a named customer.
	AUTH_REQUIRE_CUSTOMER_CLAIM: z
		.enum(["true", "false"], { message: "must be true or false" })
		.default("false")
		.transform(text => text === "true"),
	// The longest token lifetime accepted: exp at most this far past iat (or past now without iat).
	AUTH_MAX_TOKEN_AGE: duration("24h"),
	// The web application's sign-in. Without OIDC_ISSUER it asks for a token (`npm run token`).
	OIDC_ISSUER: httpUrl.optional(),
	OIDC_CLIENT_ID: z.string().min(1).max(200).optional(),
	OIDC_SCOPE: z.string().default("openid profile email"),

	SECRETS_KEY: base64Key32.optional(),
	RATE_LIMIT_PER_MINUTE: positiveInt(600),
	// Counted before authentication, so bad tokens count too. Unset: twice RATE_LIMIT_PER_MINUTE.
	RATE_LIMIT_PER_ADDRESS_PER_MINUTE: wholeNumber({ min: 1 }).optional(),
	CORS_ORIGINS: originList,
	PUBLIC_BASE_URL: httpUrl.optional(),
	// Slow clients (slowloris): how long the gateway waits for a request's headers, and for the
	// whole request, and how many connections one client address may hold open (0: no cap).
	HTTP_HEADERS_TIMEOUT: duration("15s"),
	HTTP_REQUEST_TIMEOUT: duration("20s"),
	HTTP_CONNECTIONS_PER_ADDRESS: z.coerce.number().int().min(0).default(64),

	// `file:` chooses the .eml files of the embedded default explicitly (production demands a choice).
	SMTP_URL: z
		.string()
		.refine(text => text === MAIL_TO_FILES || isSmtpServer(text), `must be an smtp:// or smtps:// URL with a host, or ${MAIL_TO_FILES} for .eml files under DATA_DIR/mail`)
		.optional(),
	MAIL_FROM: z
		.string()
		.default("Satellite Tasking <no-reply@localhost>")
		.superRefine((from, ctx) => {
			if (!senderDomain(from)) ctx.addIssue({ code: "custom", message: `"${from}" has no usable email address (use e.g. Satellite Tasking <no-reply@example.com>)` });
		}),
	MAIL_RETRY_SCHEDULE: schedule("30s,2m,10m,30m,2h"),
	UNSUBSCRIBE_TOKEN_TTL: duration("30d"),
	SMTP_CA_FILE: pemFile.optional(),
	MAIL_PREFERENCES_URL: httpUrl.optional(),
	MAIL_CONCURRENCY: positiveInt(4),
	MAIL_POLL_INTERVAL: duration("1s"),
	MAIL_LEASE: duration("60s"),
	MAIL_SEND_TIMEOUT: duration("30s"),

	WEBHOOK_ALLOW_NETS: cidrList,
	WEBHOOK_CA_FILE: pemFile.optional(),
	DELIVERY_RETRY_SCHEDULE: schedule("1m,5m,30m,2h,6h"),
	DELIVERY_TIMEOUT: duration("15s"),
	WEBHOOK_TEST_TIMEOUT: duration("5s"),
	DELIVERY_CONCURRENCY: positiveInt(64),
	DELIVERY_WEBHOOK_CONCURRENCY: positiveInt(8),
	// Connections one sender keeps to one origin (scheme, host, port). Unset: DELIVERY_CONCURRENCY,
	// so webhooks that share a host never share one webhook's few connections.
	DELIVERY_ORIGIN_CONNECTIONS: z.coerce.number().int().positive().optional(),
	// Deliveries one dispatcher holds leased at most, queued and in flight: a bound on its memory
	// (about 600 bytes of heap each, the event's body shared: 40 MB at the default 65,536). Unset:
	// LEASES_PER_CONCURRENT_ATTEMPT x DELIVERY_CONCURRENCY.
	DELIVERY_MAX_LEASES: z.coerce.number().int().positive().optional(),
	// Worker threads that send the HTTPS attempts; 0 sends them on the dispatcher's own event loop.
	DELIVERY_SENDER_THREADS: wholeNumber({ min: 0, max: 16 }).default(1),
	DELIVERY_POLL_INTERVAL: duration("1s"),
	DELIVERY_LEASE: duration("60s"),
	SECRET_ROTATION_GRACE: duration("24h"),

	// How long one read of the backlog (pending deliveries, the email outbox) answers every scrape
	// and REPL call. Counting millions of pending rows is a large index scan, worth doing less
	// often; figures fresher than a second buy nothing, and minutes old they delay the alerts.
	BACKLOG_REFRESH: duration("5s", { min: "1s", max: "5m" }),

	// Endpoint lifecycle (issue 11): auto-disable of dead endpoints and pruning of old data.
	WEBHOOK_DISABLE_AFTER: duration("5d"),
	RETENTION_PERIOD: duration("30d"),

	// OpenTelemetry traces (lib/tracing.ts), named as the OpenTelemetry specification names them.
	// Without an endpoint nothing of OpenTelemetry is loaded. Checked here, where the SDK would
	// only log a warning and carry on with a setting the operator did not ask for.
	OTEL_EXPORTER_OTLP_ENDPOINT: otlpEndpoint,
	OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: otlpEndpoint,
	OTEL_EXPORTER_OTLP_PROTOCOL: otlpProtocol.default("http/protobuf"),
	OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: otlpProtocol.optional(),
	OTEL_SERVICE_NAME: z.string().trim().min(1).max(200).optional(),
	OTEL_TRACES_SAMPLER: z.enum(TRACE_SAMPLERS, { message: `must be one of ${TRACE_SAMPLERS.join(", ")}` }).default("parentbased_always_on"),
	OTEL_TRACES_SAMPLER_ARG: z
		.string()
		.optional()
		.transform((text, ctx) => {
			if (text === undefined) return undefined;
			const ratio = /^\s*(0|1|0?\.\d+|1\.0*)\s*$/.test(text) ? Number(text) : NaN;
			if (Number.isNaN(ratio)) {
				ctx.addIssue({ code: "custom", message: `"${text}" is not a sampling ratio from 0 to 1 (e.g. 0.25)` });
				return z.NEVER;
			}
			return ratio;
		}),

	// How long the server waits at start-up for NATS (TRANSPORTER) and PostgreSQL (DATABASE_URL)
	// to answer before it stops with exit 69 (server.ts, lib/startup-dependencies.ts).
	STARTUP_CONNECT_TIMEOUT: duration("30s"),
});

export type Env = z.input<typeof EnvSchema>;

/** DELIVERY_MAX_LEASES when unset, per attempt of DELIVERY_CONCURRENCY. */
export const LEASES_PER_CONCURRENT_ATTEMPT = 1_024;

export interface AppConfig extends Omit<z.output<typeof EnvSchema>, "HOST" | "DELIVERY_ORIGIN_CONNECTIONS" | "DELIVERY_MAX_LEASES"> {
	production: boolean;
	HOST: string;
	DELIVERY_ORIGIN_CONNECTIONS: number;
	DELIVERY_MAX_LEASES: number;
	/** Present after resolveSecrets(): always set for a running service. */
	AUTH_JWT_SECRET?: string;
	SECRETS_KEY?: string;
	/** The gateway's own address once it listens (http://localhost:<bound port>), set by app.ts. */
	boundBaseUrl?: string;
}

export class ConfigError extends Error {
	constructor(message: string) {
		super(message);
		this.name = "ConfigError";
	}
}

/** One ConfigError listing every problem, each on its own line starting with its variable. */
export function invalidConfiguration(problems: string[]): ConfigError {
	return new ConfigError(`Invalid configuration:\n${problems.map(problem => `  ${problem}`).join("\n")}`);
}

/** Empty strings mean "unset", as they do in most shells and compose files. */
function setVariables(env: NodeJS.ProcessEnv | Env): Record<string, string> {
	return Object.fromEntries(Object.entries(env).filter((entry): entry is [string, string] => entry[1] !== undefined && entry[1] !== "").map(([name, value]) => [name, String(value)]));
}

/** Every problem with the variables one by one, and with those that go together. */
function parseVariables(variables: Record<string, string>): { config?: AppConfig; problems: string[] } {
	const result = EnvSchema.safeParse(variables);
	const problems = result.success ? [] : result.error.issues.map(issue => `${issue.path.join(".")}: ${issue.message}`);
	if (Boolean(variables.OIDC_ISSUER) !== Boolean(variables.OIDC_CLIENT_ID)) {
		const missing = variables.OIDC_ISSUER ? "OIDC_CLIENT_ID" : "OIDC_ISSUER";
		problems.push(`${missing}: missing; OIDC_ISSUER and OIDC_CLIENT_ID must be set together`);
	}
	if (Boolean(variables.NATS_CERT_FILE) !== Boolean(variables.NATS_KEY_FILE)) {
		const missing = variables.NATS_CERT_FILE ? "NATS_KEY_FILE" : "NATS_CERT_FILE";
		problems.push(`${missing}: missing; NATS_CERT_FILE and NATS_KEY_FILE must be set together`);
	}
	// Judged whenever TRANSPORTER itself is valid, so that it is listed beside any other problem.
	const transporterValid = variables.TRANSPORTER !== undefined && EnvSchema.shape.TRANSPORTER.safeParse(variables.TRANSPORTER).success;
	if (variables.NATS_CREDS_FILE && transporterValid && natsUrlWithCredentials(variables.TRANSPORTER)) {
		problems.push("NATS_CREDS_FILE: set beside a user name, password or token in TRANSPORTER; a node logs in to NATS one way, so keep one of them");
	}
	for (const name of NATS_FILE_VARIABLES) {
		if (variables[name] && !variables.TRANSPORTER) problems.push(`${name}: set without TRANSPORTER; it is for the connection to NATS, which only a cluster node opens`);
	}
	if (result.success && result.data.DELIVERY_MAX_LEASES !== undefined && result.data.DELIVERY_MAX_LEASES < result.data.DELIVERY_CONCURRENCY) {
		problems.push(`DELIVERY_MAX_LEASES: ${result.data.DELIVERY_MAX_LEASES} is fewer than DELIVERY_CONCURRENCY (${result.data.DELIVERY_CONCURRENCY}); a dispatcher could not keep its attempts going`);
	}
	if (!result.success || problems.length) return { problems };
	const production = result.data.NODE_ENV === "production";
	const config = {
		...result.data,
		production,
		HOST: result.data.HOST ?? (production ? "0.0.0.0" : "127.0.0.1"),
		DELIVERY_ORIGIN_CONNECTIONS: result.data.DELIVERY_ORIGIN_CONNECTIONS ?? result.data.DELIVERY_CONCURRENCY,
		DELIVERY_MAX_LEASES: result.data.DELIVERY_MAX_LEASES ?? result.data.DELIVERY_CONCURRENCY * LEASES_PER_CONCURRENT_ATTEMPT,
	};
	return { config, problems };
}

/** Validates the environment. Throws ConfigError naming every bad variable. */
export function parseConfig(env: NodeJS.ProcessEnv | Env = process.env): AppConfig {
	const { config, problems } = parseVariables(setVariables(env));
	if (!config) throw invalidConfiguration(problems);
	return config;
}

/**
 * What production demands of this node's services beyond valid values: the secrets that the
 * embedded default would generate, and a deliberate choice of where email goes. Judged on the
 * variables themselves, so that it adds to the list even when other values are bad.
 */
function productionProblems(variables: Record<string, string>): string[] {
	if (variables.NODE_ENV !== "production") return [];
	const services = EnvSchema.shape.SERVICES.safeParse(variables.SERVICES);
	// An unknown SERVICES entry is reported by itself; which services would run is then unknown.
	if (!services.success) return [];
	const runs = (name: ServiceName) => services.data.includes(name);
	const unset = (name: string) => variables[name] === undefined;
	const needs = secretsNeeded({ SERVICES: services.data, AUTH_JWKS_URL: variables.AUTH_JWKS_URL });
	const problems: string[] = [];
	if (needs.jwtSecret && unset("AUTH_JWT_SECRET")) {
		problems.push("AUTH_JWT_SECRET: required with NODE_ENV=production (at least 32 characters, e.g. from openssl rand -base64 48), or AUTH_JWKS_URL instead");
	}
	if (needs.secretsKey && unset("SECRETS_KEY")) {
		problems.push("SECRETS_KEY: required with NODE_ENV=production (base64 of 32 bytes, e.g. from openssl rand -base64 32)");
	}
	if (runs("notifier") && unset("PUBLIC_BASE_URL")) {
		problems.push("PUBLIC_BASE_URL: required with NODE_ENV=production when the notifier runs: the address the links in emails point to");
	}
	if (runs("notifier") && unset("SMTP_URL")) {
		problems.push(`SMTP_URL: required with NODE_ENV=production when the notifier runs (smtp://… or smtps://…); ${MAIL_TO_FILES} writes emails as .eml files under DATA_DIR/mail instead`);
	}
	return problems;
}

interface GeneratedSecrets {
	AUTH_JWT_SECRET: string;
	SECRETS_KEY: string;
}

/** Only the gateway checks bearer tokens; only webhooks and the notifier encrypt or sign. */
function secretsNeeded(config: Pick<AppConfig, "SERVICES" | "AUTH_JWKS_URL">): { jwtSecret: boolean; secretsKey: boolean } {
	const runs = (name: ServiceName) => config.SERVICES.includes(name);
	return {
		jwtSecret: runs("api") && !config.AUTH_JWKS_URL,
		secretsKey: runs("webhooks") || runs("notifier"),
	};
}

/**
 * Fills AUTH_JWT_SECRET and SECRETS_KEY where this node's services need them. In production a
 * needed one must be configured; elsewhere a missing one is generated once into
 * DATA_DIR/secrets.json. Returns the names of the secrets that were generated, so the caller can
 * warn about them.
 */
export function resolveSecrets(config: AppConfig): string[] {
	const needs = secretsNeeded(config);
	const needsJwtSecret = needs.jwtSecret;
	const missing = [
		...(needsJwtSecret && !config.AUTH_JWT_SECRET ? ["AUTH_JWT_SECRET (or AUTH_JWKS_URL)"] : []),
		...(needs.secretsKey && !config.SECRETS_KEY ? ["SECRETS_KEY"] : []),
	];
	if (missing.length === 0) return [];
	if (config.production) {
		throw new ConfigError(`Invalid configuration: NODE_ENV=production requires ${missing.join(" and ")}`);
	}
	const file = path.join(config.DATA_DIR, "secrets.json");
	let stored: Partial<GeneratedSecrets> = {};
	if (fs.existsSync(file)) stored = JSON.parse(fs.readFileSync(file, "utf8")) as Partial<GeneratedSecrets>;
	const generated: string[] = [];
	if (!stored.AUTH_JWT_SECRET && needsJwtSecret) {
		stored.AUTH_JWT_SECRET = crypto.randomBytes(32).toString("base64url");
		generated.push("AUTH_JWT_SECRET");
	}
	if (!stored.SECRETS_KEY && needs.secretsKey) {
		stored.SECRETS_KEY = crypto.randomBytes(32).toString("base64");
		generated.push("SECRETS_KEY");
	}
	if (generated.length) {
		fs.mkdirSync(config.DATA_DIR, { recursive: true });
		fs.writeFileSync(file, JSON.stringify(stored, null, 2), { mode: 0o600 });
	}
	if (!config.AUTH_JWT_SECRET && needsJwtSecret) config.AUTH_JWT_SECRET = stored.AUTH_JWT_SECRET;
	if (!config.SECRETS_KEY && needs.secretsKey) config.SECRETS_KEY = stored.SECRETS_KEY;
	return generated.map(name => `${name} (generated into ${file})`);
}

/** A busy or forbidden port, named by its variable, as a configuration error (exit 78). */
export function listenError(variable: string, port: number, host: string, err: NodeJS.ErrnoException): ConfigError {
	// The port is not at fault when the address is not this machine's (or not an address at all).
	if (err.code === "EADDRNOTAVAIL" || err.code === "ENOTFOUND" || err.code === "EAI_AGAIN") {
		return new ConfigError(`Invalid configuration: HOST: ${host} is not an address of this machine (${err.code}); use one of its addresses, 127.0.0.1, or 0.0.0.0 for every interface`);
	}
	const why = err.code === "EADDRINUSE" ? "is already in use by another process" : err.code === "EACCES" ? "may not be bound by this user" : `cannot be bound (${err.code ?? err.message})`;
	return new ConfigError(`Invalid configuration: ${variable}: port ${port} ${why}; stop what holds it or choose another ${variable}`);
}

/**
 * parseConfig + production's requirements + resolveSecrets: what a process needs before it starts
 * a broker. Every bad or missing value is in the one ConfigError it throws.
 */
export function loadConfig(env: NodeJS.ProcessEnv | Env = process.env): { config: AppConfig; warnings: string[] } {
	const variables = setVariables(env);
	const { config, problems } = parseVariables(variables);
	problems.push(...productionProblems(variables));
	if (!config || problems.length) throw invalidConfiguration(problems);
	const generated = resolveSecrets(config);
	const warnings = generated.length ? [`Using secrets kept under DATA_DIR, not for production: ${generated.join(", ")}`] : [];
	// Only "production" is strict: NODE_ENV=prod or staging runs like a laptop's npm start.
	if (!KNOWN_NODE_ENVS.includes(config.NODE_ENV)) {
		warnings.push(`NODE_ENV=${config.NODE_ENV} is not production: this node runs as in development (secrets may be generated, loopback only unless HOST says otherwise); a deployment sets NODE_ENV=production`);
	}
	return { config, warnings };
}

// Services find the configuration through their broker, so that tests can run several brokers
// with different settings in one process.
const configByBroker = new WeakMap<ServiceBroker, AppConfig>();

export function attachConfig(broker: ServiceBroker, config: AppConfig): void {
	configByBroker.set(broker, config);
}

export function configOf(broker: ServiceBroker): AppConfig {
	let config = configByBroker.get(broker);
	if (!config) {
		config = loadConfig(process.env).config;
		configByBroker.set(broker, config);
	}
	return config;
}
