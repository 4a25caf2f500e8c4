/// <reference lib="dom" />
// Production sign-in for real: a real OpenID Provider (oidc-provider, a child process) with RS256
// and ES256 keys in its JWKS; the web app signs in through it in Chromium (authorization code
// with PKCE, oidc-client-ts) and uses the access token against the gateway, which verifies it
// with AUTH_JWKS_URL, AUTH_ISSUER and AUTH_AUDIENCE. Then the gateway refuses tokens with the
// wrong issuer, the wrong audience, an unknown kid, HS256 forged with the public key and HS384
// signed with the right shared secret, and files webhooks under the configured customer claim.
import { spawn, type ChildProcess } from "node:child_process";
import crypto from "node:crypto";
import path from "node:path";
import { exportJWK, generateKeyPair, SignJWT, type JWK } from "jose";
import type { Browser, Page } from "playwright-core";
import { startStack, expectProblem, type Stack } from "./helpers/stack";
import { freePort } from "./helpers/net";
import { describeBrowserSuite, launchChromium, seriousViolations, screenshotBothWidths, VIEWPORTS } from "./helpers/browser";

const describeWithBrowser = describeBrowserSuite();

const AUDIENCE = "https://webhooks.example/api";
const CLIENT_ID = "satellite-webhooks-app";
const CUSTOMER_CLAIM = "org_id";

interface SigningKey {
	kid: string;
	alg: "RS256" | "ES256";
	privateKey: CryptoKey;
	publicJwk: JWK;
	privateJwk: JWK;
}

async function signingKey(kid: string, alg: "RS256" | "ES256"): Promise<SigningKey> {
	const { privateKey, publicKey } = await generateKeyPair(alg, { extractable: true });
	return {
		kid,
		alg,
		privateKey: privateKey as CryptoKey,
		publicJwk: { ...(await exportJWK(publicKey)), kid, alg, use: "sig" },
		privateJwk: { ...(await exportJWK(privateKey)), kid, alg, use: "sig" },
	};
}

function startProvider(config: object): Promise<ChildProcess> {
	const child = spawn(process.execPath, [path.join(__dirname, "helpers", "oidc-provider-child.mjs")], {
		env: { ...process.env, OIDC_TEST_CONFIG: JSON.stringify(config) },
		stdio: ["ignore", "pipe", "pipe"],
	});
	let errors = "";
	child.stderr!.on("data", chunk => (errors += chunk));
	return new Promise((resolve, reject) => {
		child.stdout!.on("data", chunk => String(chunk).includes("ready") && resolve(child));
		child.once("exit", code => reject(new Error(`oidc-provider exited with ${code}: ${errors}`)));
	});
}

describeWithBrowser("web application signing in through OpenID Connect", () => {
	let provider: ChildProcess;
	let stack: Stack;
	let browser: Browser;
	let page: Page;
	let issuer: string;
	let rsa: SigningKey;
	let ec: SigningKey;
	let accessToken = "";
	const sharedSecret = crypto.randomBytes(36).toString("base64url");

	const call = (token: string, method = "GET", urlPath = "/id/v3/user/details", body?: unknown) => stack.request(method, urlPath, { token, body });
	const mint = (key: SigningKey, claims: Record<string, unknown>, options: { issuer?: string; audience?: string; kid?: string } = {}) =>
		new SignJWT(claims)
			.setProtectedHeader({ alg: key.alg, kid: options.kid ?? key.kid, typ: "JWT" })
			.setIssuer(options.issuer ?? issuer)
			.setAudience(options.audience ?? AUDIENCE)
			.setIssuedAt()
			.setExpirationTime("10m")
			.sign(key.privateKey);

	beforeAll(async () => {
		[rsa, ec] = await Promise.all([signingKey("rs-1", "RS256"), signingKey("ec-1", "ES256")]);
		const [providerPort, gatewayPort] = await Promise.all([freePort(), freePort()]);
		issuer = `http://127.0.0.1:${providerPort}`;
		const gateway = `http://127.0.0.1:${gatewayPort}`;
		provider = await startProvider({
			port: providerPort,
			issuer,
			keys: [rsa.privateJwk, ec.privateJwk],
			client: { client_id: CLIENT_ID, redirect_uris: [`${gateway}/auth/callback`] },
			resource: AUDIENCE,
			resourceScope: "webhooks",
			accessTokenAlg: "ES256",
			customerClaim: CUSTOMER_CLAIM,
			customers: { alice: "acme", bob: "acme" },
		});
		stack = await startStack({
			services: ["api", "topics", "webhooks", "users"],
			env: {
				PORT: String(gatewayPort),
				AUTH_JWKS_URL: `${issuer}/jwks`,
				AUTH_ISSUER: issuer,
				AUTH_AUDIENCE: AUDIENCE,
				AUTH_CUSTOMER_CLAIM: CUSTOMER_CLAIM,
				// Set on purpose: a token signed with it must still be refused in JWKS mode.
				AUTH_JWT_SECRET: sharedSecret,
				OIDC_ISSUER: issuer,
				OIDC_CLIENT_ID: CLIENT_ID,
				OIDC_SCOPE: "openid profile email webhooks",
			},
		});
		browser = await launchChromium();
		const context = await browser.newContext({ viewport: VIEWPORTS.desktop, locale: "en-GB", timezoneId: "UTC" });
		page = await context.newPage();
		if (process.env.DEBUG_OIDC) {
			page.on("console", message => console.log("browser:", message.text()));
			page.on("response", response => console.log("response:", response.status(), response.url()));
		}
	});
	afterAll(async () => {
		await browser?.close();
		await stack?.stop();
		provider?.kill("SIGTERM");
	});

	it("signs in through the provider with authorization code and PKCE, keeping only the access token", async () => {
		await page.goto(stack.baseUrl + "/");
		const signIn = page.getByRole("button", { name: "Sign in with your organisation" });
		await signIn.waitFor();
		await expectNoViolations(page, "OIDC sign-in");
		await screenshotBothWidths(page, "sign-in-oidc");

		const authorizeRequest = page.waitForRequest(request => request.url().startsWith(`${issuer}/auth?`));
		await signIn.click();
		const authorize = new URL((await authorizeRequest).url());
		expect(Object.fromEntries(authorize.searchParams)).toMatchObject({
			client_id: CLIENT_ID,
			response_type: "code",
			redirect_uri: `${stack.baseUrl}/auth/callback`,
			code_challenge_method: "S256",
			code_challenge: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/),
			resource: AUDIENCE,
			scope: "openid profile email webhooks",
		});

		// oidc-provider's development login and consent pages.
		await page.locator('input[name="login"]').fill("alice");
		await page.locator('input[name="password"]').fill("any password");
		await page.getByRole("button", { name: "Sign-in" }).click();
		await page.getByRole("button", { name: "Continue" }).click();

		await page.getByRole("heading", { name: "Webhooks", level: 1 }).waitFor({ timeout: 10_000 }).catch(async error => {
			console.log(page.url(), await page.locator("body").innerText());
			throw error;
		});
		expect(new URL(page.url()).pathname).toBe("/webhooks");
		const stored = await page.evaluate(() => ({ session: Object.keys(sessionStorage), local: Object.keys(localStorage) }));
		expect(stored).toEqual({ session: ["satellite-webhooks.token"], local: [] });
		accessToken = (await page.evaluate(() => sessionStorage.getItem("satellite-webhooks.token")))!;
		const header = JSON.parse(Buffer.from(accessToken.split(".")[0], "base64url").toString());
		const claims = JSON.parse(Buffer.from(accessToken.split(".")[1], "base64url").toString());
		expect(header).toMatchObject({ alg: "ES256", kid: "ec-1" });
		expect(claims).toMatchObject({ iss: issuer, aud: AUDIENCE, sub: "alice", [CUSTOMER_CLAIM]: "acme", email: "alice@example.com" });
	});

	it("uses the access token against the API: the gateway verifies it with the provider's JWKS", async () => {
		const details = await call(accessToken);
		expect(details.status).toBe(200);
		expect(details.body).toMatchObject({ user_id: "alice", email: "alice@example.com", name: "User alice" });

		// The app works with it: create a webhook through the page.
		await page.getByLabel("Webhook Name").fill("Signed in with OIDC");
		await page.getByLabel("URL").fill("https://hooks.example.com/oidc");
		await page.getByRole("button", { name: "Create webhook" }).click();
		await page.locator(".secret-panel").waitFor();
	});

	it("honours the configured customer claim: users of one customer share webhooks, others do not see them", async () => {
		const bob = await mint(rsa, { sub: "bob", [CUSTOMER_CLAIM]: "acme" });
		const carol = await mint(rsa, { sub: "carol", customer_id: "acme" });
		const bobsView = await call(bob, "GET", "/id/v3/webhooks");
		expect(bobsView.status).toBe(200);
		expect(bobsView.body.webhooks.map((webhook: { name: string }) => webhook.name)).toEqual(["Signed in with OIDC"]);
		// carol has no org_id: `customer_id` is not the configured claim, so she is her own customer.
		const carolsView = await call(carol, "GET", "/id/v3/webhooks");
		expect(carolsView.status).toBe(200);
		expect(carolsView.body.webhooks).toEqual([]);
	});

	it("accepts RS256 and ES256 tokens signed with the JWKS keys", async () => {
		expect((await call(await mint(rsa, { sub: "dave" }))).status).toBe(200);
		expect((await call(await mint(ec, { sub: "erin" }))).status).toBe(200);
	});

	it.each([
		["the wrong issuer", async () => mint(rsa, { sub: "mallory" }, { issuer: "http://127.0.0.1:1/evil" }), /issuer|iss/],
		["the wrong audience", async () => mint(ec, { sub: "mallory" }, { audience: "https://other.example/api" }), /aud/],
		["an unknown kid", async () => mint(await signingKey("rs-unknown", "RS256"), { sub: "mallory" }), /key is unknown/],
		[
			"HS256 forged with the public key",
			async () => {
				const publicPem = crypto.createPublicKey({ key: rsa.publicJwk as crypto.JsonWebKey, format: "jwk" }).export({ type: "spki", format: "pem" });
				return new SignJWT({ sub: "mallory", [CUSTOMER_CLAIM]: "acme" })
					.setProtectedHeader({ alg: "HS256", kid: rsa.kid })
					.setIssuer(issuer)
					.setAudience(AUDIENCE)
					.setIssuedAt()
					.setExpirationTime("10m")
					.sign(new TextEncoder().encode(String(publicPem)));
			},
			/algorithm is not allowed/,
		],
		[
			"HS384 signed with the right shared secret",
			async () =>
				new SignJWT({ sub: "mallory", [CUSTOMER_CLAIM]: "acme" })
					.setProtectedHeader({ alg: "HS384" })
					.setIssuer(issuer)
					.setAudience(AUDIENCE)
					.setIssuedAt()
					.setExpirationTime("10m")
					.sign(new TextEncoder().encode(sharedSecret)),
			/algorithm is not allowed/,
		],
		[
			"an unsigned token (alg none)",
			async () => {
				const part = (value: object) => Buffer.from(JSON.stringify(value)).toString("base64url");
				return `${part({ alg: "none" })}.${part({ sub: "mallory", iss: issuer, aud: AUDIENCE, exp: Math.floor(Date.now() / 1000) + 600 })}.`;
			},
			/./,
		],
	])("refuses a token with %s (401, and nothing is created)", async (_what, makeToken, reason) => {
		const token = await makeToken();
		const read = await call(token);
		expectProblem(read, 401);
		expect(read.headers.get("www-authenticate")).toMatch(/^Bearer/);
		expect(read.body.detail).toMatch(reason);
		const before = await stack.db("webhooks").count({ count: "*" });
		expectProblem(await call(token, "POST", "/id/v3/webhooks", { name: "forged", url: "https://hooks.example.com/forged", events: ["tasking:order_status"] }), 401);
		expect(await stack.db("webhooks").count({ count: "*" })).toEqual(before);
	});
});

async function expectNoViolations(page: Page, what: string) {
	const violations = await seriousViolations(page);
	if (violations.length) console.log(`axe on ${what}:`, JSON.stringify(violations, null, 2));
	expect(violations).toEqual([]);
}
