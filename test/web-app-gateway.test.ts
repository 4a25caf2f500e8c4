// The gateway serving the web application: security headers, caching of hashed assets, the
// app's configuration, navigations answered with the page and everything else left to the API's
// 404. Needs web/dist, which `npm install` builds (the prepare script).
import fs from "node:fs";
import path from "node:path";
import { startStack, expectProblem, type Stack } from "./helpers/stack";
import { rawExchange } from "./helpers/raw-http";
import { parseConfig, ConfigError } from "../lib/config";
import { WEB_DIST_DIR } from "../lib/web-app";

const html = { accept: "text/html,application/xhtml+xml" };

describe("web application served by the gateway", () => {
	let stack: Stack;
	beforeAll(async () => {
		if (!fs.existsSync(path.join(WEB_DIST_DIR, "index.html"))) throw new Error("web/dist is missing: run npm run build:web (npm install does it)");
		stack = await startStack({ services: ["api", "topics", "webhooks", "users"] });
	});
	afterAll(() => stack?.stop());

	it("serves the page at / with a strict CSP, nosniff, no referrer and no framing, revalidated on every load", async () => {
		const response = await stack.request("GET", "/", { headers: html });
		expect(response.status).toBe(200);
		expect(response.headers.get("content-type")).toBe("text/html; charset=utf-8");
		expect(response.headers.get("cache-control")).toBe("no-cache");
		const csp = response.headers.get("content-security-policy")!;
		expect(csp).toContain("default-src 'none'");
		expect(csp).toContain("script-src 'self'");
		expect(csp).toContain("frame-ancestors 'none'");
		expect(csp).not.toContain("unsafe-inline");
		expect(csp).not.toContain("unsafe-eval");
		expect(response.headers.get("x-content-type-options")).toBe("nosniff");
		expect(response.headers.get("referrer-policy")).toBe("no-referrer");
		expect(response.headers.get("x-frame-options")).toBe("DENY");
		expect(response.text).toMatch(/<script type="module" crossorigin src="\/assets\/[\w-]+\.js">/);
		expect(response.text).not.toMatch(/<script>|<style>|style="/);
	});

	it("caches hashed assets for a year as immutable, with their own content types", async () => {
		const page = (await stack.request("GET", "/")).text;
		const assets = [...page.matchAll(/(?:src|href)="(\/assets\/[^"]+)"/g)].map(match => match[1]);
		expect(assets.length).toBeGreaterThanOrEqual(2);
		for (const asset of assets) {
			const response = await stack.request("GET", asset);
			expect(response.status).toBe(200);
			expect(response.headers.get("cache-control")).toBe("public, max-age=31536000, immutable");
			expect(response.headers.get("content-type")).toMatch(asset.endsWith(".js") ? /^(text|application)\/javascript/ : /^text\/css/);
			expect(response.headers.get("x-content-type-options")).toBe("nosniff");
		}
	});

	it("answers the app's own paths with the page for browser navigations only", async () => {
		for (const route of ["/webhooks", "/webhooks/5f0c3c52-0000-4000-8000-000000000000", "/notifications", "/auth/callback?code=x&state=y"]) {
			const response = await stack.request("GET", route, { headers: html });
			expect(response.status).toBe(200);
			expect(response.text).toContain('<div id="app">');
		}
		// A script asking for a missing hashed file gets a 404, never HTML it would try to run.
		expectProblem(await stack.request("GET", "/assets/index-missing.js", { headers: html }), 404);
		expectProblem(await stack.request("GET", "/elsewhere"), 404);
		expectProblem(await stack.request("POST", "/", { body: {} }), 404);
		expectProblem(await stack.request("DELETE", "/webhooks", { headers: html }), 404);
	});

	it("never serves files outside web/dist", async () => {
		// Over a raw socket, byte for byte: fetch would resolve "/../" and "/%2e%2e/" itself and
		// send "/package.json", so the gateway would never see the dot segments.
		for (const attempt of ["/../package.json", "/%2e%2e/package.json", "/assets/..%2f..%2fpackage.json", "/%2e%2e%2f%2e%2e%2fdata/secrets.json", "/.env"]) {
			const answers = await rawExchange(stack.baseUrl, `GET ${attempt} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`);
			expect({ attempt, answers: answers.length }).toEqual({ attempt, answers: 1 });
			const [response] = answers;
			expect(response.body).not.toContain('"dependencies"');
			expect(response.body).not.toContain("AUTH_JWT_SECRET");
			expect({ attempt, status: [400, 403, 404].includes(response.status) }).toEqual({ attempt, status: true });
		}
	});

	it("leaves the API as it was: /id/v3 still needs a token and answers problem details", async () => {
		expectProblem(await stack.request("GET", "/id/v3/webhooks", { headers: html }), 401);
		expectProblem(await stack.request("GET", "/id/v3/nowhere", { headers: html, token: await stack.token("alice") }), 404);
		const openapi = await stack.request("GET", "/openapi.json");
		expect(openapi.status).toBe(200);
		expect(openapi.body.paths).toHaveProperty(["/id/v3/webhooks/{id}/stats"]);
	});

	it("tells the app to ask for a token, with the command that mints one, when no OIDC issuer is configured", async () => {
		const response = await stack.request("GET", "/config.json");
		expect(response.status).toBe(200);
		expect(response.headers.get("cache-control")).toBe("no-store");
		expect(response.body).toEqual({ auth: { mode: "token", token_command: expect.stringMatching(/^npm run -s token -- --sub /) }, api_base: "/id/v3" });
	});
});

describe("web application with OpenID Connect configured", () => {
	let stack: Stack;
	beforeAll(async () => {
		stack = await startStack({
			services: ["api", "topics"],
			env: { OIDC_ISSUER: "https://id.example.com/realms/sat", OIDC_CLIENT_ID: "webhooks-app", AUTH_AUDIENCE: "https://api.example.com" },
		});
	});
	afterAll(() => stack?.stop());

	it("exposes the issuer, client id, scope and audience, and allows the issuer's origin to be fetched", async () => {
		const response = await stack.request("GET", "/config.json");
		expect(response.body.auth).toEqual({ mode: "oidc", issuer: "https://id.example.com/realms/sat", client_id: "webhooks-app", scope: "openid profile email", audience: "https://api.example.com" });
		const page = await stack.request("GET", "/");
		expect(page.headers.get("content-security-policy")).toContain("connect-src 'self' https://id.example.com;");
	});

	it("refuses an issuer without a client id (and the reverse) at start-up", () => {
		expect(() => parseConfig({ OIDC_ISSUER: "https://id.example.com" })).toThrow(ConfigError);
		expect(() => parseConfig({ OIDC_CLIENT_ID: "app" })).toThrow(/OIDC_ISSUER and OIDC_CLIENT_ID must be set together/);
		expect(() => parseConfig({ OIDC_ISSUER: "not a url", OIDC_CLIENT_ID: "app" })).toThrow(/OIDC_ISSUER/);
	});
});

describe("Docker image of the web application (checked without a Docker engine)", () => {
	const root = path.join(__dirname, "..");
	const dockerfile = fs.readFileSync(path.join(root, "Dockerfile"), "utf8").replace(/\\\n/g, " ");
	const stages = dockerfile
		.split(/^FROM /m)
		.slice(1)
		.map(stage => stage.split("\n").map(line => line.trim()).filter(line => line && !line.startsWith("#")));
	const [buildStage, finalStage] = stages;

	it("builds the app in a stage of its own, with the dev dependencies", () => {
		expect(stages).toHaveLength(2);
		expect(buildStage[0]).toMatch(/^node:24\S* AS build$/);
		expect(buildStage).toContainEqual(expect.stringMatching(/^RUN npm ci\b(?!.*--omit=dev)/));
		expect(buildStage[buildStage.length - 1]).toMatch(/^RUN .*\bnpx tsx scripts\/build-web\.ts$/);
		expect(buildStage).toContain("COPY web ./web");
		// Everything the stage copies exists in the repository.
		for (const line of buildStage.filter(instruction => instruction.startsWith("COPY "))) {
			const sources = line.split(/\s+/).slice(1, -1);
			for (const source of sources) expect(fs.existsSync(path.join(root, source))).toBe(true);
		}
	});

	it("installs production dependencies only, and copies the built app from the build stage", () => {
		const install = finalStage.findIndex(line => line.startsWith("RUN npm ci"));
		expect(finalStage[install]).toMatch(/--omit=dev/);
		// npm ci runs the prepare script: its file must be there before the install (it then skips, finding no Vite).
		expect(finalStage.slice(0, install)).toContain("COPY scripts/build-web.ts ./scripts/");
		expect(finalStage.indexOf("COPY --from=build /build/web/dist ./web/dist")).toBeGreaterThan(install);
		// Vite, Preact and oidc-client-ts are bundled at build time: none is a production dependency.
		const manifest = JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf8"));
		for (const buildOnly of ["vite", "preact", "oidc-client-ts", "@preact/preset-vite"]) {
			expect(manifest.dependencies).not.toHaveProperty([buildOnly]);
			expect(manifest.devDependencies).toHaveProperty([buildOnly]);
		}
		expect(manifest.scripts.prepare).toBe("tsx scripts/build-web.ts");
		expect(fs.readFileSync(path.join(root, ".dockerignore"), "utf8").split("\n")).toContain("web/dist");
	});
});
