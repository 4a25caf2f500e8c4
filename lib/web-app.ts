// Serving the web application (web/, built by Vite into web/dist) from the gateway: hashed assets
// cached for a year, index.html revalidated on every load, a strict Content-Security-Policy and
// the usual hardening headers on everything the app is made of, and GET /config.json telling the
// app how users sign in. Paths the app routes itself (/webhooks/…) answer index.html to browser
// navigations; anything else unknown falls through to the gateway's 404 problem.
import fs from "node:fs";
import path from "node:path";
import type { IncomingMessage, ServerResponse } from "node:http";
import serveStatic from "serve-static";
import type { AppConfig } from "./config";
import { PROJECT_ROOT } from "./project-root";

export const WEB_DIST_DIR = path.join(PROJECT_ROOT, "web", "dist");
const ASSETS_PREFIX = "/assets/";
const YEAR_SECONDS = 365 * 24 * 3600;

/** What the app reads from GET /config.json before it shows anything. */
export interface WebClientConfig {
	auth: { mode: "token"; token_command: string } | { mode: "oidc"; issuer: string; client_id: string; scope: string; audience: string | null };
	api_base: string;
}

export function webClientConfig(config: AppConfig): WebClientConfig {
	const auth: WebClientConfig["auth"] =
		config.OIDC_ISSUER && config.OIDC_CLIENT_ID
			? { mode: "oidc", issuer: config.OIDC_ISSUER, client_id: config.OIDC_CLIENT_ID, scope: config.OIDC_SCOPE, audience: config.AUTH_AUDIENCE ?? null }
			: { mode: "token", token_command: "npm run -s token -- --sub <your user id> --email <your address> --customer <your customer id>" };
	return { auth, api_base: "/id/v3" };
}

/**
 * Headers for every response that belongs to the app. The policy allows only the app's own files:
 * no inline script or style, no eval, no framing; the API is same-origin, and the identity
 * provider's origin is allowed for the discovery and token requests oidc-client-ts makes.
 */
export function webSecurityHeaders(config: AppConfig): Record<string, string> {
	const connect = ["'self'", ...(config.OIDC_ISSUER ? [new URL(config.OIDC_ISSUER).origin] : [])];
	const policy = [
		"default-src 'none'",
		"script-src 'self'",
		"style-src 'self'",
		"img-src 'self' data:",
		"font-src 'self'",
		`connect-src ${connect.join(" ")}`,
		"manifest-src 'self'",
		"base-uri 'none'",
		"form-action 'self'",
		"frame-ancestors 'none'",
		"object-src 'none'",
	].join("; ");
	return {
		"Content-Security-Policy": policy,
		"X-Content-Type-Options": "nosniff",
		"Referrer-Policy": "no-referrer",
		"X-Frame-Options": "DENY",
		"Cross-Origin-Opener-Policy": "same-origin",
		"Cross-Origin-Resource-Policy": "same-origin",
		"Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=(), usb=()",
	};
}

type Next = (err?: unknown) => void;
export type WebAppHandler = (req: IncomingMessage, res: ServerResponse, next: Next) => void;

const NOT_BUILT_PAGE = `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Web application not built</title></head>
<body><h1>The web application is not built</h1><p>Run <code>npm run build:web</code> (or <code>npm install</code>), then reload.</p></body></html>`;

function acceptsHtml(req: IncomingMessage): boolean {
	return (req.headers.accept ?? "").includes("text/html");
}

export function createWebAppHandler(config: AppConfig, distDir: string = WEB_DIST_DIR): WebAppHandler {
	const headers = webSecurityHeaders(config);
	const clientConfig = JSON.stringify(webClientConfig(config));
	const indexFile = path.join(distDir, "index.html");
	const files = serveStatic(distDir, {
		index: false,
		redirect: false,
		dotfiles: "ignore",
		fallthrough: true,
		setHeaders(res, filePath) {
			const hashed = filePath.startsWith(path.join(distDir, "assets") + path.sep);
			res.setHeader("Cache-Control", hashed ? `public, max-age=${YEAR_SECONDS}, immutable` : "no-cache");
		},
	});

	const sendIndex = (res: ServerResponse) => {
		let html: Buffer;
		try {
			html = fs.readFileSync(indexFile);
		} catch {
			res.statusCode = 503;
			res.setHeader("Content-Type", "text/html; charset=utf-8");
			res.setHeader("Cache-Control", "no-store");
			res.end(NOT_BUILT_PAGE);
			return;
		}
		res.statusCode = 200;
		res.setHeader("Content-Type", "text/html; charset=utf-8");
		res.setHeader("Cache-Control", "no-cache");
		res.end(html);
	};

	return (req, res, next) => {
		const method = req.method ?? "GET";
		if (method !== "GET" && method !== "HEAD") return next();
		const url = new URL(req.url ?? "/", "http://app.invalid");
		for (const [name, value] of Object.entries(headers)) res.setHeader(name, value);
		if (url.pathname === "/config.json") {
			res.setHeader("Content-Type", "application/json; charset=utf-8");
			res.setHeader("Cache-Control", "no-store");
			res.end(method === "HEAD" ? undefined : clientConfig);
			return;
		}
		if (url.pathname === "/" || url.pathname === "/index.html") return sendIndex(res);
		files(req, res, () => {
			// An unknown asset is a 404, never the page: a stale hashed name must not load HTML as script.
			if (url.pathname.startsWith(ASSETS_PREFIX) || !acceptsHtml(req) || path.extname(url.pathname)) return next();
			sendIndex(res);
		});
	};
}
