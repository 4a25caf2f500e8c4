// What the server prints once it is up: where to go next. Before, the last lines of `npm start`
// were moleculer's route table, and a newcomer had to find the web app, the API and the token
// command in the docs.
import path from "node:path";
import { MAIL_TO_FILES, type AppConfig } from "./config";
import { tracingSettings } from "./tracing";

export interface BoundPorts {
	/** The gateway's port, when this node runs the api service. */
	api?: number;
	/** The /health and /metrics server's port. */
	ops?: number;
}

const LOOPBACK_OR_ANY = new Set(["0.0.0.0", "::", "127.0.0.1", "::1", "localhost"]);

/** The host to put in a URL for HOST: a wildcard or loopback address is reached as localhost. */
function urlHost(host: string): string {
	if (LOOPBACK_OR_ANY.has(host)) return "localhost";
	return host.includes(":") ? `[${host}]` : host;
}

function storage(config: AppConfig): string {
	if (config.DATABASE_URL) return "PostgreSQL";
	return `SQLite in ${path.join(config.DATA_DIR, "service.sqlite")}`;
}

function mail(config: AppConfig): string {
	if (config.SMTP_URL && config.SMTP_URL !== MAIL_TO_FILES) return `email over ${new URL(config.SMTP_URL).protocol.replace(":", "")}`;
	return `email as .eml files in ${path.join(config.DATA_DIR, "mail")}`;
}

/** A shell word: quoted only when it needs to be. */
function shellWord(text: string): string {
	return /^[\w./:@=-]+$/.test(text) ? text : `'${text.replace(/'/g, `'\\''`)}'`;
}

/**
 * The lines that say where this node's endpoints are and, where the gateway checks its own
 * HS256 tokens, the command that mints one (with DATA_DIR when it is not the default, because
 * the command reads the secret from there).
 */
export function startupSummary(config: AppConfig, ports: BoundPorts): string[] {
	const host = urlHost(config.HOST);
	const details = [...(config.SERVICES.some(name => ["webhooks", "users", "dispatcher", "notifier"].includes(name)) ? [storage(config)] : []), ...(config.SERVICES.includes("notifier") ? [mail(config)] : [])];
	const lines = [`Running ${config.SERVICES.join(", ")}${details.length ? ` (${details.join(", ")})` : ""}`];
	const row = (label: string, value: string) => lines.push(`  ${label.padEnd(9)}${value}`);
	if (ports.api !== undefined) {
		const base = `http://${host}:${ports.api}`;
		row("Web app", `${base}/`);
		row("API", `${base}/id/v3`);
		row("OpenAPI", `${base}/openapi.json`);
	}
	if (ports.ops !== undefined) {
		row("Health", `http://${host}:${ports.ops}/health`);
		row("Metrics", `http://${host}:${ports.ops}/metrics`);
	}
	const tracing = tracingSettings(config);
	// The collector's address without any path or query a vendor might put a key in.
	if (tracing) row("Traces", `${new URL(tracing.url).origin} (${tracing.protocol}, service.name ${tracing.serviceName}, sampler ${tracing.sampler})`);
	if (ports.api !== undefined && !config.AUTH_JWKS_URL) {
		// The command signs with AUTH_JWT_SECRET, or else with the secret generated into DATA_DIR.
		const secretFrom = config.production ? "AUTH_JWT_SECRET=… " : path.normalize(config.DATA_DIR) === path.normalize("./data") ? "" : `DATA_DIR=${shellWord(config.DATA_DIR)} `;
		row("Token", `${secretFrom}npm run -s token -- --sub alice --email alice@example.com`);
	}
	if (!config.production && (config.HOST === "127.0.0.1" || config.HOST === "::1")) {
		lines.push(`Listening on this machine only (HOST=${config.HOST}); HOST=0.0.0.0 accepts connections from others.`);
	}
	return lines;
}
