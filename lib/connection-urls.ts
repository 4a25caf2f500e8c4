// The servers' URLs an operator gives (TRANSPORTER, DATABASE_URL) and the files of NATS's TLS and
// credentials, as the clients take them and as logs may show them.
import fs from "node:fs";
import tls from "node:tls";
import type { Authenticator } from "nats";

/** NATS's convention: a user name with no password (nats://s3cret@nats:4222) is a token. */
function isNatsToken(url: URL): boolean {
	return (url.protocol === "nats:" || url.protocol === "tls:") && url.username !== "" && url.password === "";
}

/** A URL (or a comma-separated list of them) safe to print: any password or NATS token becomes "***". */
export function maskedUrl(text: string): string {
	return text
		.split(",")
		.map(part => {
			try {
				const url = new URL(part.trim());
				if (url.password) url.password = "***";
				else if (isNatsToken(url)) url.username = "***";
				return url.toString().replace(/\/$/, "");
			} catch {
				return "(not a URL)";
			}
		})
		.join(",");
}

/** The files a node's connections to NATS read (lib/config.ts); an AppConfig has them. */
export interface NatsFiles {
	NATS_CA_FILE?: string;
	NATS_CERT_FILE?: string;
	NATS_KEY_FILE?: string;
	NATS_CREDS_FILE?: string;
}

/** nats.js's TLS options: present, even empty, they make the client refuse a connection without TLS. */
export interface NatsTlsOptions {
	/** PEM certificates, concatenated. */
	ca?: string;
	cert?: string;
	key?: string;
}

export interface NatsServerOptions {
	servers: string[];
	user?: string;
	pass?: string;
	token?: string;
	/** From NATS_CREDS_FILE: signs the server's challenge with the user's key and sends its JWT. */
	authenticator?: Authenticator;
	tls?: NatsTlsOptions;
}

/** nats.js's authenticator for a .creds file, nats.js loaded only here: an embedded node never opens a connection. */
function credsAuthenticatorOf(creds: Buffer): Authenticator {
	const { credsAuthenticator } = require("nats") as typeof import("nats");
	return credsAuthenticator(creds);
}

/** The first of TRANSPORTER's URLs with a user name, password or token in it, if any. */
export function natsUrlWithCredentials(transporter: string): URL | undefined {
	return transporter
		.split(",")
		.map(server => new URL(server.trim()))
		.find(url => url.username);
}

function natsCredentials(url: URL | undefined): Pick<NatsServerOptions, "user" | "pass" | "token"> {
	if (!url) return {};
	if (isNatsToken(url)) return { token: decodeURIComponent(url.username) };
	return { user: decodeURIComponent(url.username), pass: decodeURIComponent(url.password) };
}

/**
 * nats.js's options for a TRANSPORTER value (one or more comma-separated nats:// or tls:// URLs)
 * and the node's NATS files (TLS, .creds). nats.js reads only host and port from a server: a user
 * and password in the URL, or a token (a user name alone), become options of their own, taken from
 * the first URL that has them, percent-decoded. Without any of the TLS settings nats.js still takes
 * TLS when the server demands it, trusting the public roots only.
 */
export function natsServerOptions(transporter: string, files: NatsFiles = {}): NatsServerOptions {
	const urls = transporter.split(",").map(server => new URL(server.trim()));
	const read = (file: string) => fs.readFileSync(file, "utf8");
	// tls:// in TRANSPORTER, or a CA or a certificate of this node's own.
	const demandsTls = urls.some(url => url.protocol === "tls:") || Boolean(files.NATS_CA_FILE || files.NATS_CERT_FILE);
	return {
		servers: urls.map(url => url.host),
		...natsCredentials(natsUrlWithCredentials(transporter)),
		...(files.NATS_CREDS_FILE ? { authenticator: credsAuthenticatorOf(fs.readFileSync(files.NATS_CREDS_FILE)) } : {}),
		...(demandsTls
			? {
					tls: {
						// Added to the public roots, as WEBHOOK_CA_FILE is.
						...(files.NATS_CA_FILE ? { ca: [...tls.rootCertificates, read(files.NATS_CA_FILE)].join("\n") } : {}),
						...(files.NATS_CERT_FILE && files.NATS_KEY_FILE ? { cert: read(files.NATS_CERT_FILE), key: read(files.NATS_KEY_FILE) } : {}),
					},
				}
			: {}),
	};
}
