// Bearer-token checks with jose. The embedded default verifies HS256 with a shared secret;
// production verifies RS256/ES256 against a JWKS URL with issuer and audience. Only the
// configured algorithms are accepted, so `alg: none` and algorithm-confusion tokens fail.
import { createRemoteJWKSet, jwtVerify, SignJWT, errors as joseErrors, type JWTPayload } from "jose";
import type { AppConfig } from "./config";
import { isWellFormedText } from "./schemas/common";
import { EXTERNAL_ID_PATTERN, implicitCustomerId, MAX_IMPLICIT_USER_ID_LENGTH } from "./customers";

export interface Principal {
	userId: string;
	customerId: string;
	name: string | null;
	email: string | null;
	lastLogin: string | null;
	/** The token's OAuth scopes (the space-separated `scope` claim); empty without one. */
	scopes: string[];
}

/** The scope a producer outside the broker needs to post order events over HTTP. */
export const EVENTS_PUBLISH_SCOPE = "events:publish";

const SCOPE_TOKEN = /^[\x21\x23-\x5b\x5d-\x7e]{1,100}$/;

/**
 * RFC 6749 3.3: `scope` is a space-separated list. A claim of any other shape grants nothing,
 * and so does any entry that is not a valid scope token.
 */
function scopesFrom(value: unknown): string[] {
	if (typeof value !== "string" || value.length > 4_000) return [];
	return [...new Set(value.split(" ").filter(scope => SCOPE_TOKEN.test(scope)))];
}

export function hasScope(principal: Pick<Principal, "scopes"> | undefined, scope: string): boolean {
	return principal?.scopes.includes(scope) ?? false;
}

export class AuthenticationError extends Error {
	readonly code = 401;
	readonly type = "unauthorized";
	constructor(message: string) {
		super(message);
		this.name = "AuthenticationError";
	}
}

export type TokenVerifier = (token: string) => Promise<Principal>;

// Expiry is the issuer's decision: only a few seconds of skew, whatever AUTH_CLOCK_SKEW says.
const EXPIRY_TOLERANCE_SECONDS = 5;

const TIME_CLAIMS = ["exp", "nbf", "iat", "auth_time"] as const;

/** What principalFrom needs from the configuration. */
interface ClaimRules {
	customerClaim: string;
	requireCustomerClaim: boolean;
	skewSeconds: number;
	maxTokenAgeSeconds: number;
}

/**
 * Every time claim present is a finite, non-negative number of seconds: JSON's 1e309 parses as
 * Infinity, which every comparison would otherwise take as "never expires" or "long ago".
 */
function checkTimeClaims(payload: JWTPayload): void {
	for (const claim of TIME_CLAIMS) {
		const value = payload[claim];
		if (value !== undefined && (typeof value !== "number" || !Number.isFinite(value) || value < 0)) throw new AuthenticationError(`Token claim ${claim} is not a valid time`);
	}
}

/** A claim that must be a time no later than now (plus the allowed skew): iat, auth_time. */
function pastInstant(payload: JWTPayload, claim: "iat" | "auth_time", skewSeconds: number): number | undefined {
	const value = payload[claim] as number | undefined;
	if (value === undefined) return undefined;
	if (value > Date.now() / 1000 + skewSeconds) throw new AuthenticationError(`Token claim ${claim} is in the future`);
	return value;
}

/** A leaked token is only as dangerous as it is long-lived: exp may lie at most the bound past iat (or now). */
function checkLifetime(payload: JWTPayload, issuedAt: number | undefined, maxAgeSeconds: number): void {
	const from = issuedAt ?? Date.now() / 1000;
	if (typeof payload.exp === "number" && payload.exp - from > maxAgeSeconds) {
		throw new AuthenticationError(`Token lifetime exceeds the ${maxAgeSeconds} s this service accepts (AUTH_MAX_TOKEN_AGE)`);
	}
}

/** The customer the token acts for: the named one, or the user's own (implicit) customer. */
function customerOf(payload: JWTPayload, sub: string, rules: ClaimRules): string {
	const claim = rules.customerClaim;
	const value = payload[claim];
	if (value === undefined) {
		if (rules.requireCustomerClaim) throw new AuthenticationError(`Token has no ${claim} claim, which this service requires`);
		if (sub.length > MAX_IMPLICIT_USER_ID_LENGTH) throw new AuthenticationError(`Token has no ${claim} claim, and its sub is too long to be its own customer (at most ${MAX_IMPLICIT_USER_ID_LENGTH} characters)`);
		return implicitCustomerId(sub);
	}
	if (typeof value !== "string" || !EXTERNAL_ID_PATTERN.test(value)) throw new AuthenticationError(`Token claim ${claim} is not a usable id`);
	return value;
}

/** Names from a token are shown back to people: a string that is not valid Unicode is dropped. */
function text(value: unknown, max: number): string | null {
	return typeof value === "string" && value.length <= max && isWellFormedText(value) ? value : null;
}

function principalFrom(payload: JWTPayload, rules: ClaimRules): Principal {
	const sub = payload.sub;
	if (typeof sub !== "string" || !EXTERNAL_ID_PATTERN.test(sub)) throw new AuthenticationError("Token has no usable sub claim");
	const customerId = customerOf(payload, sub, rules);
	checkTimeClaims(payload);
	// jose allowed exp the whole skew (its one tolerance also covers nbf): hold exp to a few seconds.
	if (typeof payload.exp === "number" && payload.exp <= Date.now() / 1000 - EXPIRY_TOLERANCE_SECONDS) throw new AuthenticationError("Token has expired");
	const issuedAt = pastInstant(payload, "iat", rules.skewSeconds);
	checkLifetime(payload, issuedAt, rules.maxTokenAgeSeconds);
	const loginSeconds = pastInstant(payload, "auth_time", rules.skewSeconds) ?? issuedAt;
	return {
		userId: sub,
		customerId,
		name: text(payload.name, 200),
		email: text(payload.email, 320),
		// A login within the allowed skew ahead of our clock is recorded as now, never in the future.
		lastLogin: loginSeconds === undefined ? null : new Date(Math.min(loginSeconds * 1000, Date.now())).toISOString(),
		scopes: scopesFrom(payload.scope),
	};
}

function describeJoseError(err: unknown): string {
	if (err instanceof joseErrors.JWTExpired) return "Token has expired";
	if (err instanceof joseErrors.JWTClaimValidationFailed) {
		return err.reason === "missing" ? `Token has no ${err.claim} claim` : `Token claim check failed: ${err.claim}`;
	}
	if (err instanceof joseErrors.JOSEAlgNotAllowed) return "Token algorithm is not allowed";
	if (err instanceof joseErrors.JWSSignatureVerificationFailed) return "Token signature is invalid";
	if (err instanceof joseErrors.JWKSNoMatchingKey) return "Token key is unknown";
	if (err instanceof AuthenticationError) return err.message;
	return "Token is malformed or cannot be verified";
}

export function createTokenVerifier(config: AppConfig): TokenVerifier {
	const skewSeconds = config.AUTH_CLOCK_SKEW / 1000;
	const rules: ClaimRules = {
		customerClaim: config.AUTH_CUSTOMER_CLAIM,
		requireCustomerClaim: config.AUTH_REQUIRE_CUSTOMER_CLAIM,
		skewSeconds,
		maxTokenAgeSeconds: config.AUTH_MAX_TOKEN_AGE / 1000,
	};
	// A token without exp would be valid forever; nbf is checked by jose within the same skew.
	const options = {
		issuer: config.AUTH_ISSUER,
		audience: config.AUTH_AUDIENCE,
		clockTolerance: skewSeconds,
		requiredClaims: ["exp"],
	};
	if (config.AUTH_JWKS_URL) {
		const jwks = createRemoteJWKSet(new URL(config.AUTH_JWKS_URL));
		const algorithms = config.AUTH_ALGORITHMS.length ? config.AUTH_ALGORITHMS : ["RS256", "ES256"];
		return rememberVerifiedTokens(async token => {
			try {
				const { payload, protectedHeader, key } = await jwtVerify(token, jwks, { ...options, algorithms });
				return {
					principal: principalFrom(payload, rules),
					expiresAt: payload.exp,
					// The key set is reloaded when stale or when an unknown key appears; a kept
					// verification stands only while the set still gives this token the very key that
					// verified it, so a rotated-out key is refused exactly as without the cache.
					stillVerifiable: () => jwks(protectedHeader, undefined).then(current => current === key, () => false),
				};
			} catch (err) {
				throw new AuthenticationError(describeJoseError(err));
			}
		});
	}
	if (!config.AUTH_JWT_SECRET) throw new Error("AUTH_JWT_SECRET is not configured");
	const key = new TextEncoder().encode(config.AUTH_JWT_SECRET);
	return rememberVerifiedTokens(async token => {
		try {
			const { payload } = await jwtVerify(token, key, { ...options, algorithms: ["HS256"] });
			return { principal: principalFrom(payload, rules), expiresAt: payload.exp };
		} catch (err) {
			throw new AuthenticationError(describeJoseError(err));
		}
	});
}

const VERIFIED_TOKEN_CACHE_SIZE = 10_000;
// Never trust a cached verification for longer than this, whatever the token's own expiry.
const VERIFIED_TOKEN_MAX_AGE_MS = 60_000;

/**
 * A client sends the same token on every request until it expires; verifying its signature and
 * claims each time is most of the cost of authentication. Successful verifications are kept, by
 * the exact token string, until the token expires (or for a minute at most) and, with a JWKS,
 * while its key is still the one the key set gives; failures are never cached.
 */
interface Verification {
	principal: Principal;
	expiresAt?: number;
	/** JWKS mode: whether the current key set would still verify the token with the same key. */
	stillVerifiable?: () => Promise<boolean>;
}

function rememberVerifiedTokens(verify: (token: string) => Promise<Verification>): TokenVerifier {
	const verified = new Map<string, Verification & { validUntil: number }>();
	return async token => {
		const now = Date.now();
		const cached = verified.get(token);
		if (cached && cached.validUntil > now && (!cached.stillVerifiable || (await cached.stillVerifiable()))) return cached.principal;
		const verification = await verify(token);
		const { expiresAt } = verification;
		const validUntil = Math.min(now + VERIFIED_TOKEN_MAX_AGE_MS, expiresAt !== undefined ? expiresAt * 1000 : Infinity);
		if (verified.size >= VERIFIED_TOKEN_CACHE_SIZE) verified.clear();
		verified.set(token, { ...verification, validUntil });
		return verification.principal;
	};
}

export interface TokenRequest {
	sub: string;
	email?: string;
	name?: string;
	customer?: string;
	/** Space-separated OAuth scopes, e.g. "events:publish". */
	scope?: string;
	expiresIn?: string;
}

/** Mints an HS256 token the embedded default accepts (npm run token, tests, benchmarks). */
export async function mintToken(config: AppConfig, request: TokenRequest): Promise<string> {
	if (!config.AUTH_JWT_SECRET) throw new Error("AUTH_JWT_SECRET is not configured (JWKS mode cannot mint tokens)");
	const claims: JWTPayload = {};
	if (request.email) claims.email = request.email;
	if (request.name) claims.name = request.name;
	if (request.customer) claims[config.AUTH_CUSTOMER_CLAIM] = request.customer;
	if (request.scope) claims.scope = request.scope;
	let jwt = new SignJWT(claims)
		.setProtectedHeader({ alg: "HS256", typ: "JWT" })
		.setSubject(request.sub)
		.setIssuedAt()
		.setExpirationTime(request.expiresIn ?? "12h");
	if (config.AUTH_ISSUER) jwt = jwt.setIssuer(config.AUTH_ISSUER);
	if (config.AUTH_AUDIENCE) jwt = jwt.setAudience(config.AUTH_AUDIENCE);
	return jwt.sign(new TextEncoder().encode(config.AUTH_JWT_SECRET));
}
