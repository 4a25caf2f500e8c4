// Before a cluster node starts its broker, it waits a bounded time (STARTUP_CONNECT_TIMEOUT) for
// NATS (TRANSPORTER) and PostgreSQL (DATABASE_URL) to answer. Without this, a node whose NATS is
// down failed at once with a bare "CONNECTION_REFUSED", and one whose database is down printed
// knex's stack traces: neither said which setting or address was at fault. A dependency that is
// still starting (compose, a rebooting host) gets the whole wait; one that refuses this node's
// credentials, database name or TLS certificate, presents a certificate the node cannot trust, or
// has no TLS where the node demands it will not change its mind, so that stops at once.
import { setTimeout as sleep } from "node:timers/promises";
import knex from "knex";
import { invalidConfiguration, type AppConfig } from "./config";
import { maskedUrl, natsServerOptions, type NatsFiles } from "./connection-urls";

/** Exit status for "a service this program needs is unavailable" (sysexits.h EX_UNAVAILABLE). */
export const EXIT_UNAVAILABLE = 69;

const RETRY_EVERY_MS = 1_000;
// One try never uses the whole wait, so that a server that comes up meanwhile is still found.
const LONGEST_TRY_MS = 5_000;

/** A dependency that did not answer within the wait; its message has one line per dependency. */
export class DependencyUnavailableError extends Error {
	constructor(readonly lines: string[]) {
		super(lines.join("\n"));
		this.name = "DependencyUnavailableError";
	}
}

interface Dependency {
	variable: "TRANSPORTER" | "DATABASE_URL";
	/** "NATS at nats://127.0.0.1:4222" */
	label: string;
	/** Resolves once the dependency answered; rejects otherwise, within about timeoutMs. */
	probe(timeoutMs: number): Promise<void>;
	/** Why a failure will not go away by waiting (wrong credentials, no such database), if so. */
	refusal(err: unknown): string | undefined;
}

// The server's certificate does not verify against the public roots and the CA the node was given
// (NATS_CA_FILE, or sslrootcert in DATABASE_URL): Node's codes.
const UNTRUSTED_CERTIFICATE = new Set([
	"UNABLE_TO_VERIFY_LEAF_SIGNATURE",
	"UNABLE_TO_GET_ISSUER_CERT",
	"UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
	"SELF_SIGNED_CERT_IN_CHAIN",
	"DEPTH_ZERO_SELF_SIGNED_CERT",
	"CERT_HAS_EXPIRED",
	"CERT_NOT_YET_VALID",
	"ERR_TLS_CERT_ALTNAME_INVALID",
]);
// The server's TLS alert for a client certificate it wants and did not get, or does not accept.
const CLIENT_CERTIFICATE_REFUSED = /^ERR_SSL_(SSLV3_ALERT_BAD_CERTIFICATE|TLSV13_ALERT_CERTIFICATE_REQUIRED|TLSV1_ALERT_UNKNOWN_CA|SSLV3_ALERT_CERTIFICATE_UNKNOWN)$/;

function natsDependency(transporter: string, natsFiles: NatsFiles): Dependency {
	return {
		variable: "TRANSPORTER",
		label: `NATS at ${maskedUrl(transporter)}`,
		async probe(timeoutMs) {
			// nats.js loads only here, in a cluster node: an embedded one never opens a connection.
			const { connect } = require("nats") as typeof import("nats");
			const connection = await connect({ ...natsServerOptions(transporter, natsFiles), name: "startup-check", timeout: timeoutMs, reconnect: false });
			await connection.close();
		},
		refusal(err) {
			const code = (err as { code?: unknown }).code;
			if (typeof code !== "string") return undefined;
			if (code === "AUTHORIZATION_VIOLATION") return "refused this node's credentials (AUTHORIZATION_VIOLATION)";
			if (code === "SERVER_OPT_NA") return "offers no TLS, which this node demands (a tls:// URL in TRANSPORTER, NATS_CA_FILE or NATS_CERT_FILE)";
			if (UNTRUSTED_CERTIFICATE.has(code)) return `presented a certificate this node does not trust (${code}); NATS_CA_FILE names the CA that signed it`;
			if (CLIENT_CERTIFICATE_REFUSED.test(code)) {
				return `refused this node's TLS certificate (${code}); a server that verifies its clients wants NATS_CERT_FILE and NATS_KEY_FILE, signed by a CA it trusts`;
			}
			return undefined;
		},
	};
}

// Authentication failed (28P01, 28000) or the database does not exist (3D000).
const POSTGRES_REFUSALS = new Set(["28P01", "28000", "3D000"]);

function postgresDependency(databaseUrl: string): Dependency {
	return {
		variable: "DATABASE_URL",
		label: `PostgreSQL at ${maskedUrl(databaseUrl)}`,
		async probe(timeoutMs) {
			const silent = () => undefined;
			const db = knex({
				client: "pg",
				connection: { connectionString: databaseUrl, connectionTimeoutMillis: timeoutMs },
				pool: { min: 0, max: 1 },
				acquireConnectionTimeout: timeoutMs + 1_000,
				// knex logs every failed connection with its stack; the caller reports the outcome.
				log: { warn: silent, error: silent, debug: silent, deprecate: silent },
			});
			try {
				await db.raw("select 1");
			} finally {
				await db.destroy();
			}
		},
		refusal(err) {
			const failure = err as { code?: unknown; message?: string };
			if (typeof failure.code === "string" && POSTGRES_REFUSALS.has(failure.code)) return `refused the connection: ${failure.message}`;
			if (typeof failure.code === "string" && UNTRUSTED_CERTIFICATE.has(failure.code)) {
				return `presented a certificate this node does not trust (${failure.code}); sslrootcert=<file> in DATABASE_URL names the CA that signed it`;
			}
			// node-postgres's own words (it gives no code) when sslmode asks for TLS and the server has none.
			if (failure.message === "The server does not support SSL connections") return "offers no TLS, which sslmode in DATABASE_URL demands";
			return undefined;
		},
	};
}

/** The code (ECONNREFUSED, CONNECTION_REFUSED, …) or the first line of a failure. */
function reasonOf(err: unknown): string {
	const failure = (err ?? {}) as { code?: unknown; message?: unknown };
	if (typeof failure.code === "string" && failure.code) return failure.code;
	return String(failure.message ?? err).split("\n")[0].slice(0, 200);
}

const seconds = (ms: number) => `${Number((ms / 1000).toFixed(1))}s`;

type Outcome = { ok: true } | { ok: false; refused: boolean; line: string };

async function waitFor(dependency: Dependency, waitMs: number, onWaiting: (line: string) => void): Promise<Outcome> {
	const deadline = Date.now() + waitMs;
	for (let attempt = 1; ; attempt += 1) {
		let failure: unknown;
		try {
			await dependency.probe(Math.max(250, Math.min(LONGEST_TRY_MS, deadline - Date.now())));
			return { ok: true };
		} catch (err) {
			failure = err;
		}
		const refusal = dependency.refusal(failure);
		if (refusal) return { ok: false, refused: true, line: `${dependency.variable}: ${dependency.label} ${refusal}` };
		if (Date.now() + RETRY_EVERY_MS >= deadline) {
			return {
				ok: false,
				refused: false,
				line: `${dependency.variable}: ${dependency.label} did not answer within ${seconds(waitMs)} (${reasonOf(failure)}); is it running at that address? STARTUP_CONNECT_TIMEOUT sets the wait`,
			};
		}
		if (attempt === 1) onWaiting(`Waiting up to ${seconds(waitMs)} for ${dependency.label} (${dependency.variable}): ${reasonOf(failure)}`);
		await sleep(RETRY_EVERY_MS);
	}
}

/**
 * Resolves once every configured dependency answered. Throws ConfigError (exit 78) for a refusal
 * that waiting cannot mend, or DependencyUnavailableError (exit 69) once STARTUP_CONNECT_TIMEOUT
 * has passed; both name the variable and the address, with any password masked.
 */
export async function waitForDependencies(config: AppConfig, onWaiting: (line: string) => void = () => undefined): Promise<void> {
	// Every service but the gateway owns tables; a gateway-only node never opens the database.
	const usesDatabase = config.SERVICES.some(name => name !== "api");
	const dependencies = [...(config.TRANSPORTER ? [natsDependency(config.TRANSPORTER, config)] : []), ...(config.DATABASE_URL && usesDatabase ? [postgresDependency(config.DATABASE_URL)] : [])];
	const outcomes = await Promise.all(dependencies.map(dependency => waitFor(dependency, config.STARTUP_CONNECT_TIMEOUT, onWaiting)));
	const failed = outcomes.filter((outcome): outcome is Extract<Outcome, { ok: false }> => !outcome.ok);
	const refused = failed.filter(outcome => outcome.refused);
	if (refused.length) throw invalidConfiguration(refused.map(outcome => outcome.line));
	if (failed.length) throw new DependencyUnavailableError(failed.map(outcome => `Cannot start: ${outcome.line}`));
}
