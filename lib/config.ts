// Configuration: environment variables validated with zod at startup. A bad value stops
// startup with a message naming the variable. In the embedded default, missing secrets are
// generated once into DATA_DIR so that `npm start` needs no set-up; in production they are fatal.
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";
import { z } from "zod";
import type { ServiceBroker } from "moleculer";
import { parseAllowList } from "./address-ranges";
import { parseDuration, parseDurationList } from "./durations";

const duration = (fallback: string) =>
	z
		.string()
		.default(fallback)
		.transform((text, ctx) => {
			try {
				return parseDuration(text);
			} catch (err) {
				ctx.addIssue({ code: "custom", message: (err as Error).message });
				return z.NEVER;
			}
		});

const csv = z
	.string()
	.default("")
	.transform(text =>
		text
			.split(",")
			.map(part => part.trim())
			.filter(Boolean),
	);

const cidrList = csv.superRefine((cidrs, ctx) => {
	try {
		parseAllowList(cidrs);
	} catch (err) {
		ctx.addIssue({ code: "custom", message: `${(err as Error).message} (use e.g. 127.0.0.1/32,::1/128)` });
	}
});

// Read at start-up, so that a wrong path stops the process with the variable's name rather than
// failing the first delivery or email with a stack trace.
const pemFile = z.string().superRefine((file, ctx) => {
	let pem: string;
	try {
		pem = fs.readFileSync(file, "utf8");
	} catch (err) {
		ctx.addIssue({ code: "custom", message: `cannot read ${file} (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})` });
		return;
	}
	if (!pem.includes("-----BEGIN CERTIFICATE-----")) ctx.addIssue({ code: "custom", message: `${file} holds no PEM certificate` });
});

const base64Key32 = z
	.string()
	.refine(text => Buffer.from(text, "base64").length === 32, "must be base64 of exactly 32 bytes");

/** "*" or a bare origin: scheme, host and port, no path. */
function isOrigin(text: string): boolean {
	if (text === "*") return true;
	try {
		return new URL(text).origin === text.replace(/\/$/, "").toLowerCase();
	} catch {
		return false;
	}
}

const positiveInt = (fallback: number) => z.coerce.number().int().positive().default(fallback);

export const ALL_SERVICES = ["api", "topics", "webhooks", "users", "dispatcher", "notifier"] as const;
export type ServiceName = (typeof ALL_SERVICES)[number];

// Exported so that a test can hold the README's configuration table to exactly these variables.
export const EnvSchema = z.object({
	NODE_ENV: z.string().default("development"),
	PORT: z.coerce.number().int().min(0).max(65535).default(3000),
	OPS_PORT: z.coerce.number().int().min(0).max(65535).default(3030),
	HOST: z.string().default("0.0.0.0"),
	DATA_DIR: z.string().default("./data"),
	DATABASE_URL: z
		.string()
		.regex(/^postgres(ql)?:\/\//, "must be a postgres:// URL")
		.optional(),
	DATABASE_SCHEMA: z
		.string()
		.regex(/^[a-z_][a-z0-9_]{0,62}$/, "must be a lower-case SQL identifier")
		.optional(),
	TRANSPORTER: z
		.string()
		.regex(/^nats:\/\//, "must be a nats:// URL")
		.optional(),
	NAMESPACE: z.string().default(""),
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
	AUTH_JWKS_URL: z.string().url().optional(),
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
	OIDC_ISSUER: z.string().url().optional(),
	OIDC_CLIENT_ID: z.string().min(1).max(200).optional(),
	OIDC_SCOPE: z.string().default("openid profile email"),

	SECRETS_KEY: base64Key32.optional(),
	RATE_LIMIT_PER_MINUTE: positiveInt(600),
	// Counted before authentication, so bad tokens count too. Unset: twice RATE_LIMIT_PER_MINUTE.
	RATE_LIMIT_PER_ADDRESS_PER_MINUTE: z.coerce.number().int().positive().optional(),
	CORS_ORIGINS: csv.pipe(z.array(z.string().refine(isOrigin, "each entry must be * or an origin such as https://app.example.com"))).transform(origins => origins.map(origin => (origin === "*" ? origin : new URL(origin).origin))),
	PUBLIC_BASE_URL: z.string().url().optional(),
	// Slow clients (slowloris): how long the gateway waits for a request's headers, and for the
	// whole request, and how many connections one client address may hold open (0: no cap).
	HTTP_HEADERS_TIMEOUT: duration("15s"),
	HTTP_REQUEST_TIMEOUT: duration("20s"),
	HTTP_CONNECTIONS_PER_ADDRESS: z.coerce.number().int().min(0).default(64),

	SMTP_URL: z
		.string()
		.regex(/^smtps?:\/\//, "must be an smtp:// or smtps:// URL")
		.optional(),
	MAIL_FROM: z.string().default("Satellite Tasking <no-reply@localhost>"),
	MAIL_RETRY_SCHEDULE: z.string().default("30s,2m,10m,30m,2h"),
	UNSUBSCRIBE_TOKEN_TTL: duration("30d"),
	SMTP_CA_FILE: pemFile.optional(),
	MAIL_PREFERENCES_URL: z.string().url().optional(),
	MAIL_CONCURRENCY: positiveInt(4),
	MAIL_POLL_INTERVAL: duration("1s"),
	MAIL_LEASE: duration("60s"),
	MAIL_SEND_TIMEOUT: duration("30s"),

	WEBHOOK_ALLOW_NETS: cidrList,
	WEBHOOK_CA_FILE: pemFile.optional(),
	DELIVERY_RETRY_SCHEDULE: z.string().default("1m,5m,30m,2h,6h"),
	DELIVERY_TIMEOUT: duration("15s"),
	WEBHOOK_TEST_TIMEOUT: duration("5s"),
	DELIVERY_CONCURRENCY: positiveInt(64),
	DELIVERY_WEBHOOK_CONCURRENCY: positiveInt(8),
	// Worker threads that send the HTTPS attempts; 0 sends them on the dispatcher's own event loop.
	DELIVERY_SENDER_THREADS: z.coerce.number().int().min(0).max(16).default(1),
	DELIVERY_POLL_INTERVAL: duration("1s"),
	DELIVERY_LEASE: duration("60s"),
	SECRET_ROTATION_GRACE: duration("24h"),

	// Endpoint lifecycle (issue 11): auto-disable of dead endpoints and pruning of old data.
	WEBHOOK_DISABLE_AFTER: duration("5d"),
	RETENTION_PERIOD: duration("30d"),
});

export type Env = z.input<typeof EnvSchema>;

export interface AppConfig extends Omit<z.output<typeof EnvSchema>, "DELIVERY_RETRY_SCHEDULE" | "MAIL_RETRY_SCHEDULE"> {
	production: boolean;
	DELIVERY_RETRY_SCHEDULE: number[];
	MAIL_RETRY_SCHEDULE: number[];
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

function scheduleFrom(name: string, text: string): number[] {
	try {
		const offsets = parseDurationList(text);
		if (offsets.length === 0) throw new Error("needs at least one offset");
		if (offsets.some((offset, i) => i > 0 && offset <= offsets[i - 1])) throw new Error("offsets must increase");
		return offsets;
	} catch (err) {
		throw new ConfigError(`Invalid configuration: ${name}: ${(err as Error).message}`);
	}
}

/** Validates the environment. Throws ConfigError naming every bad variable. */
export function parseConfig(env: NodeJS.ProcessEnv | Env = process.env): AppConfig {
	// Empty strings mean "unset", as they do in most shells and compose files.
	const cleaned = Object.fromEntries(Object.entries(env).filter(([, value]) => value !== undefined && value !== ""));
	const result = EnvSchema.safeParse(cleaned);
	if (!result.success) {
		const lines = result.error.issues.map(issue => `  ${issue.path.join(".")}: ${issue.message}`);
		throw new ConfigError(`Invalid configuration:\n${lines.join("\n")}`);
	}
	const parsed = result.data;
	if (Boolean(parsed.OIDC_ISSUER) !== Boolean(parsed.OIDC_CLIENT_ID)) {
		throw new ConfigError("Invalid configuration:\n  OIDC_ISSUER and OIDC_CLIENT_ID must be set together");
	}
	return {
		...parsed,
		production: parsed.NODE_ENV === "production",
		DELIVERY_RETRY_SCHEDULE: scheduleFrom("DELIVERY_RETRY_SCHEDULE", parsed.DELIVERY_RETRY_SCHEDULE),
		MAIL_RETRY_SCHEDULE: scheduleFrom("MAIL_RETRY_SCHEDULE", parsed.MAIL_RETRY_SCHEDULE),
	};
}

interface GeneratedSecrets {
	AUTH_JWT_SECRET: string;
	SECRETS_KEY: string;
}

/** Only the gateway checks bearer tokens; only webhooks and the notifier encrypt or sign. */
function secretsNeeded(config: AppConfig): { jwtSecret: boolean; secretsKey: boolean } {
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
export function listenError(variable: string, port: number, err: NodeJS.ErrnoException): ConfigError {
	const why = err.code === "EADDRINUSE" ? "is already in use by another process" : err.code === "EACCES" ? "may not be bound by this user" : `cannot be bound (${err.code ?? err.message})`;
	return new ConfigError(`Invalid configuration: ${variable}: port ${port} ${why}; stop what holds it or choose another ${variable}`);
}

/** parseConfig + resolveSecrets: what a process needs before it starts a broker. */
export function loadConfig(env: NodeJS.ProcessEnv | Env = process.env): { config: AppConfig; warnings: string[] } {
	const config = parseConfig(env);
	const generated = resolveSecrets(config);
	const warnings = generated.length ? [`Using secrets kept under DATA_DIR, not for production: ${generated.join(", ")}`] : [];
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
