// The servers' URLs an operator gives (TRANSPORTER, DATABASE_URL) as the clients take them and as
// logs may show them.

/** A URL (or a comma-separated list of them) safe to print: any password becomes "***". */
export function maskedUrl(text: string): string {
	return text
		.split(",")
		.map(part => {
			try {
				const url = new URL(part.trim());
				if (url.password) url.password = "***";
				return url.toString().replace(/\/$/, "");
			} catch {
				return "(not a URL)";
			}
		})
		.join(",");
}

export interface NatsServerOptions {
	servers: string[];
	user?: string;
	pass?: string;
}

/**
 * nats.js's options for a TRANSPORTER value (one or more comma-separated nats:// URLs). nats.js
 * reads only host and port from a server: a user and password in the URL become options of their
 * own, taken from the first URL that has them, percent-decoded.
 */
export function natsServerOptions(transporter: string): NatsServerOptions {
	const urls = transporter.split(",").map(server => new URL(server.trim()));
	const withCredentials = urls.find(url => url.username);
	return {
		servers: urls.map(url => url.host),
		...(withCredentials ? { user: decodeURIComponent(withCredentials.username), pass: decodeURIComponent(withCredentials.password) } : {}),
	};
}
