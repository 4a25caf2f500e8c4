// A real OpenID Provider (panva's oidc-provider, ESM-only, hence a child process) for the OIDC
// browser test. Configuration arrives as JSON in OIDC_TEST_CONFIG:
//   { port, issuer, keys: [private JWKs], client: {client_id, redirect_uris}, resource, resourceScope,
//     accessTokenAlg, customerClaim, customers: {login: customer} }
// It signs ID tokens and JWT access tokens for `resource` (RFC 8707) with the given keys, puts
// the customer claim, email and name into the access token, and uses oidc-provider's built-in
// development login and consent pages (any login name, any password). Prints "ready" when listening.
import Provider, { errors } from "oidc-provider";

const config = JSON.parse(process.env.OIDC_TEST_CONFIG);

const provider = new Provider(config.issuer, {
	jwks: { keys: config.keys },
	clients: [
		{
			client_id: config.client.client_id,
			token_endpoint_auth_method: "none",
			redirect_uris: config.client.redirect_uris,
			post_logout_redirect_uris: config.client.post_logout_redirect_uris ?? [],
			grant_types: ["authorization_code"],
			response_types: ["code"],
			id_token_signed_response_alg: "RS256",
		},
	],
	pkce: { required: () => true },
	claims: { openid: ["sub"], email: ["email", "email_verified"], profile: ["name"] },
	async findAccount(_ctx, sub) {
		return {
			accountId: sub,
			async claims() {
				return { sub, email: `${sub}@example.com`, email_verified: true, name: `User ${sub}` };
			},
		};
	},
	features: {
		devInteractions: { enabled: true },
		resourceIndicators: {
			enabled: true,
			defaultResource: async () => config.resource,
			useGrantedResource: async () => true,
			getResourceServerInfo: async (_ctx, resourceIndicator) => {
				if (resourceIndicator !== config.resource) throw new errors.InvalidTarget();
				return { scope: config.resourceScope, audience: config.resource, accessTokenFormat: "jwt", accessTokenTTL: 600, jwt: { sign: { alg: config.accessTokenAlg } } };
			},
		},
	},
	async extraTokenClaims(_ctx, token) {
		if (token.kind !== "AccessToken") return undefined;
		const customer = config.customers[token.accountId];
		return {
			email: `${token.accountId}@example.com`,
			name: `User ${token.accountId}`,
			...(customer ? { [config.customerClaim]: customer } : {}),
		};
	},
	clientBasedCORS: (_ctx, origin, client) => client.redirectUris.some(uri => new URL(uri).origin === origin),
	cookies: { keys: ["oidc-test-cookie-key-0123456789"] },
});
// Quiet: the development-only warnings are expected here.
provider.on("server_error", (_ctx, error) => process.stderr.write(`oidc-provider server_error: ${error.stack}\n`));

const server = provider.listen(config.port, "127.0.0.1", () => process.stdout.write("ready\n"));
process.on("SIGTERM", () => server.close(() => process.exit(0)));
