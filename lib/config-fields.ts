// The field types of the configuration's schema (lib/config.ts): durations, retry schedules,
// whole numbers and ports, lists, address ranges, PEM files, keys, origins and the OTLP settings.
// Each turns one environment variable's text into its value, or into a plain message naming what
// is wrong with it, which config.ts gathers into the one startup error that lists every variable.
import fs from "node:fs";
import { z } from "zod";
import { parseAllowList } from "./address-ranges";
import { parseDuration, parseDurationList } from "./durations";

/** A duration, e.g. "15s"; `range` bounds it, written as durations too ({ min: "1s", max: "5m" }). */
export const duration = (fallback: string, range?: { min: string; max: string }) =>
	z
		.string()
		.default(fallback)
		.transform((text, ctx) => {
			try {
				const millis = parseDuration(text);
				if (range && (millis < parseDuration(range.min) || millis > parseDuration(range.max))) throw new Error(`"${text}" is not from ${range.min} to ${range.max}`);
				return millis;
			} catch (err) {
				ctx.addIssue({ code: "custom", message: (err as Error).message });
				return z.NEVER;
			}
		});

/** Retry offsets from the first attempt: increasing durations, e.g. "1m,5m,30m,2h,6h". */
export const schedule = (fallback: string) =>
	z
		.string()
		.default(fallback)
		.transform((text, ctx) => {
			try {
				const offsets = parseDurationList(text);
				if (offsets.length === 0) throw new Error("needs at least one offset");
				if (offsets.some((offset, i) => i > 0 && offset <= offsets[i - 1])) throw new Error("offsets must increase");
				return offsets;
			} catch (err) {
				ctx.addIssue({ code: "custom", message: (err as Error).message });
				return z.NEVER;
			}
		});

/**
 * A whole number within bounds, with a message as plain as the durations' ("abc" is not a whole
 * number from 0 to 65535) rather than zod's "expected number, received NaN".
 */
export const wholeNumber = (range: { min: number; max?: number; hint?: string }) =>
	z.union([z.string(), z.number()]).transform((value, ctx) => {
		const text = String(value).trim();
		const number = /^\d+$/.test(text) ? Number(text) : NaN;
		if (!Number.isSafeInteger(number) || number < range.min || (range.max !== undefined && number > range.max)) {
			const bounds = range.max === undefined ? `of at least ${range.min}` : `from ${range.min} to ${range.max}`;
			ctx.addIssue({ code: "custom", message: `"${value}" is not a whole number ${bounds}${range.hint ? ` (${range.hint})` : ""}` });
			return z.NEVER;
		}
		return number;
	});

export const port = (fallback: number) => wholeNumber({ min: 0, max: 65535, hint: "0 picks a free port" }).default(fallback);

export const positiveInt = (fallback: number) => wholeNumber({ min: 1 }).default(fallback);

export const csv = z
	.string()
	.default("")
	.transform(text =>
		text
			.split(",")
			.map(part => part.trim())
			.filter(Boolean),
	);

export const cidrList = csv.superRefine((cidrs, ctx) => {
	try {
		parseAllowList(cidrs);
	} catch (err) {
		ctx.addIssue({ code: "custom", message: `${(err as Error).message} (use e.g. 127.0.0.1/32,::1/128)` });
	}
});

// Read at start-up, so that a wrong path stops the process with the variable's name rather than
// failing the first delivery, email or connection with a stack trace.
function pemFileHolding(marker: RegExp, what: string) {
	return z.string().superRefine((file, ctx) => {
		let pem: string;
		try {
			pem = fs.readFileSync(file, "utf8");
		} catch (err) {
			ctx.addIssue({ code: "custom", message: `cannot read ${file} (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})` });
			return;
		}
		if (!marker.test(pem)) ctx.addIssue({ code: "custom", message: `${file} holds no ${what}` });
	});
}

export const pemFile = pemFileHolding(/-----BEGIN CERTIFICATE-----/, "PEM certificate");
export const pemKeyFile = pemFileHolding(/-----BEGIN [A-Z ]*PRIVATE KEY-----/, "PEM private key");
/** What `nsc` and NATS's cloud hand out: a user's JWT and its NKey seed. */
export const natsCredsFile = pemFileHolding(/-----BEGIN NATS USER JWT-----[\s\S]*-----BEGIN USER NKEY SEED-----/, "NATS user JWT and NKey seed (a .creds file)");

export const base64Key32 = z
	.string()
	.refine(text => Buffer.from(text, "base64").length === 32, "must be base64 of exactly 32 bytes");

/** `text` as a URL, when it parses as one (a port in range, no space in the host) of these schemes. */
function urlOf(text: string, protocols: string[]): URL | undefined {
	try {
		const url = new URL(text);
		return protocols.includes(url.protocol) ? url : undefined;
	} catch {
		return undefined;
	}
}

const natsServerOf = (text: string) => {
	const url = urlOf(text, ["nats:", "tls:"]);
	return url?.hostname ? url : undefined;
};

// Checked whole at start-up: a bad entry was otherwise waited on for STARTUP_CONNECT_TIMEOUT and
// reported as a NATS server that did not answer (exit 69), and an http:// entry was taken for a
// NATS server. The text stays as given (the clients read it, lib/connection-urls.ts); no entry is
// echoed, since it may hold a password. tls:// demands TLS of the connection, which is one for
// all the servers: a list that mixes the two schemes would leave it unclear which is meant.
export const natsServerList = z.string().superRefine((text, ctx) => {
	const servers = text.split(",").map(part => natsServerOf(part.trim()));
	const bad = servers.findIndex(server => !server);
	if (bad >= 0) {
		ctx.addIssue({ code: "custom", message: `must be nats://host:port (tls://host:port to demand TLS), or several such URLs comma-separated (entry ${bad + 1} is not)` });
	} else if (new Set(servers.map(server => server!.protocol)).size > 1) {
		ctx.addIssue({ code: "custom", message: "mixes nats:// and tls:// entries; TLS is one choice for every server: use tls:// for all of them, or nats:// for all" });
	}
});

/**
 * A postgres:// (or postgresql://) URL that parses: a host with a space or a port out of range
 * was otherwise waited on like a server that does not answer. The host may be empty, as in
 * postgres:///db?host=/var/run/postgresql (a Unix socket). Never echoed: it may hold a password.
 */
export const postgresUrl = z.string().refine(text => urlOf(text, ["postgres:", "postgresql:"]) !== undefined, "must be a postgres://user:password@host:port/database URL");

/**
 * An smtp:// or smtps:// URL with a host, and a port in range if it has one: checked at start-up,
 * since a notifier with a server it cannot reach fails each email's attempts until their retries
 * are spent.
 */
export const isSmtpServer = (text: string) => Boolean(urlOf(text, ["smtp:", "smtps:"])?.hostname);

/**
 * An http:// or https:// URL with a host, for the addresses the service fetches (AUTH_JWKS_URL,
 * OIDC_ISSUER) or writes into links (PUBLIC_BASE_URL, MAIL_PREFERENCES_URL): zod's url() also
 * takes ftp: or javascript:, which would fail at the first fetch or land in an email's link.
 */
export const httpUrl = z.string().refine(text => Boolean(urlOf(text, ["http:", "https:"])?.hostname), "must be an http:// or https:// URL");

/** "*" or a bare origin: scheme, host and port, no path. */
function isOrigin(text: string): boolean {
	if (text === "*") return true;
	try {
		return new URL(text).origin === text.replace(/\/$/, "").toLowerCase();
	} catch {
		return false;
	}
}

/** Comma-separated origins or "*", each origin kept as URL writes it (lower case, no trailing slash). */
export const originList = csv.pipe(z.array(z.string().refine(isOrigin, "each entry must be * or an origin such as https://app.example.com"))).transform(origins => origins.map(origin => (origin === "*" ? origin : new URL(origin).origin)));

/** An OTLP/HTTP endpoint: http or https, no credentials in the URL (OTEL_EXPORTER_OTLP_HEADERS carries them). */
export const otlpEndpoint = z
	.string()
	.optional()
	.superRefine((text, ctx) => {
		if (text === undefined) return;
		let url: URL;
		try {
			url = new URL(text);
		} catch {
			ctx.addIssue({ code: "custom", message: `"${text}" is not a URL (use e.g. http://otel-collector:4318)` });
			return;
		}
		if (url.protocol !== "http:" && url.protocol !== "https:") ctx.addIssue({ code: "custom", message: "must be an http:// or https:// URL (OTLP over HTTP)" });
		else if (url.username || url.password) ctx.addIssue({ code: "custom", message: "must not carry credentials; put them in OTEL_EXPORTER_OTLP_HEADERS" });
	});

// gRPC is left out: only the two HTTP encodings are exercised by the tests.
export const otlpProtocol = z.enum(["http/protobuf", "http/json"], { message: "must be http/protobuf or http/json (gRPC is not supported)" });
