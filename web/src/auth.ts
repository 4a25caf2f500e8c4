// Signing in. The embedded default takes a token pasted by the user (minted with `npm run
// token`); with OIDC_ISSUER the app runs the authorization code flow with PKCE through
// oidc-client-ts. Either way only the access token is kept, in sessionStorage: the library's
// user record lives in memory, and its PKCE state only for the length of the redirect.
import { InMemoryWebStorage, UserManager, WebStorageStateStore } from "oidc-client-ts";
import type { WebClientConfig } from "./types";

const TOKEN_KEY = "satellite-webhooks.token";
export const CALLBACK_PATH = "/auth/callback";

export function storedToken(): string | null {
	return sessionStorage.getItem(TOKEN_KEY);
}

export function storeToken(token: string): void {
	sessionStorage.setItem(TOKEN_KEY, token);
}

export function forgetToken(): void {
	sessionStorage.removeItem(TOKEN_KEY);
}

/** A JWT is three base64url parts; anything else would only earn a 401. */
export function looksLikeJwt(text: string): boolean {
	return /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/.test(text);
}

type OidcConfig = Extract<WebClientConfig["auth"], { mode: "oidc" }>;

export function userManager(config: OidcConfig): UserManager {
	const origin = window.location.origin;
	const extra: Record<string, string> = config.audience ? { audience: config.audience, resource: config.audience } : {};
	return new UserManager({
		authority: config.issuer,
		client_id: config.client_id,
		redirect_uri: origin + CALLBACK_PATH,
		post_logout_redirect_uri: origin + "/",
		response_type: "code",
		scope: config.scope,
		extraQueryParams: extra,
		automaticSilentRenew: false,
		monitorSession: false,
		loadUserInfo: false,
		userStore: new WebStorageStateStore({ store: new InMemoryWebStorage() }),
		stateStore: new WebStorageStateStore({ store: window.sessionStorage }),
	});
}

/** Completes the redirect back from the provider; returns the access token. */
export async function completeOidcSignIn(config: OidcConfig): Promise<string> {
	const user = await userManager(config).signinRedirectCallback();
	if (!user.access_token) throw new Error("The identity provider returned no access token");
	return user.access_token;
}
