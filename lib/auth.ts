// Bearer-token checks with jose. The embedded default verifies HS256 with a shared secret;
// production verifies RS256/ES256 against a JWKS URL with issuer and audience. Only the
// configured algorithms are accepted, so `alg: none` and algorithm-confusion tokens fail.
import { createRemoteJWKSet, jwtVerify, SignJWT, errors as joseErrors, type JWTPayload } from "jose";
import type { AppConfig } from "./config";

export interface Principal {
	userId: string;
	customerId: string;
	name: string | null;
	email: string | null;
	lastLogin: string | null;
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

const ID_PATTERN = /^[\w.@|:+-]{1,200}$/;

function principalFrom(payload: JWTPayload, customerClaim: string): Principal {
	const sub = payload.sub;
	if (typeof sub !== "string" || !ID_PATTERN.test(sub)) throw new AuthenticationError("Token has no usable sub claim");
	const customerValue = payload[customerClaim];
	if (customerValue !== undefined && (typeof customerValue !== "string" || !ID_PATTERN.test(customerValue))) {
		throw new AuthenticationError(`Token claim ${customerClaim} is not a usable id`);
	}
	const text = (value: unknown, max: number) => (typeof value === "string" && value.length <= max ? value : null);
	const loginSeconds = typeof payload.auth_time === "number" ? payload.auth_time : payload.iat;
	return {
		userId: sub,
		customerId: (customerValue as string | undefined) ?? sub,
		name: text(payload.name, 200),
		email: text(payload.email, 320),
		lastLogin: typeof loginSeconds === "number" && Number.isFinite(loginSeconds) ? new Date(loginSeconds * 1000).toISOString() : null,
	};
}

function describeJoseError(err: unknown): string {
	if (err instanceof joseErrors.JWTExpired) return "Token has expired";
	if (err instanceof joseErrors.JWTClaimValidationFailed) return `Token claim check failed: ${err.claim}`;
	if (err instanceof joseErrors.JOSEAlgNotAllowed) return "Token algorithm is not allowed";
	if (err instanceof joseErrors.JWSSignatureVerificationFailed) return "Token signature is invalid";
	if (err instanceof joseErrors.JWKSNoMatchingKey) return "Token key is unknown";
	if (err instanceof AuthenticationError) return err.message;
	return "Token is malformed or cannot be verified";
}

export function createTokenVerifier(config: AppConfig): TokenVerifier {
	const options = {
		issuer: config.AUTH_ISSUER,
		audience: config.AUTH_AUDIENCE,
		clockTolerance: 5,
	};
	if (config.AUTH_JWKS_URL) {
		const jwks = createRemoteJWKSet(new URL(config.AUTH_JWKS_URL));
		const algorithms = config.AUTH_ALGORITHMS.length ? config.AUTH_ALGORITHMS : ["RS256", "ES256"];
		return rememberVerifiedTokens(async token => {
			try {
				const { payload } = await jwtVerify(token, jwks, { ...options, algorithms });
				return { principal: principalFrom(payload, config.AUTH_CUSTOMER_CLAIM), expiresAt: payload.exp };
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
			return { principal: principalFrom(payload, config.AUTH_CUSTOMER_CLAIM), expiresAt: payload.exp };
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
 * claims each time is most of the cost of authentication. Successful verifications are kept
 * until the token expires (or for a minute at most); failures are never cached.
 */
function rememberVerifiedTokens(verify: (token: string) => Promise<{ principal: Principal; expiresAt?: number }>): TokenVerifier {
	const verified = new Map<string, { principal: Principal; validUntil: number }>();
	return async token => {
		const now = Date.now();
		const cached = verified.get(token);
		if (cached && cached.validUntil > now) return cached.principal;
		const { principal, expiresAt } = await verify(token);
		const validUntil = Math.min(now + VERIFIED_TOKEN_MAX_AGE_MS, expiresAt !== undefined ? expiresAt * 1000 : Infinity);
		if (verified.size >= VERIFIED_TOKEN_CACHE_SIZE) verified.clear();
		verified.set(token, { principal, validUntil });
		return principal;
	};
}

export interface TokenRequest {
	sub: string;
	email?: string;
	name?: string;
	customer?: string;
	expiresIn?: string;
}

/** Mints an HS256 token the embedded default accepts (npm run token, tests, benchmarks). */
export async function mintToken(config: AppConfig, request: TokenRequest): Promise<string> {
	if (!config.AUTH_JWT_SECRET) throw new Error("AUTH_JWT_SECRET is not configured (JWKS mode cannot mint tokens)");
	const claims: JWTPayload = {};
	if (request.email) claims.email = request.email;
	if (request.name) claims.name = request.name;
	if (request.customer) claims[config.AUTH_CUSTOMER_CLAIM] = request.customer;
	let jwt = new SignJWT(claims)
		.setProtectedHeader({ alg: "HS256", typ: "JWT" })
		.setSubject(request.sub)
		.setIssuedAt()
		.setExpirationTime(request.expiresIn ?? "12h");
	if (config.AUTH_ISSUER) jwt = jwt.setIssuer(config.AUTH_ISSUER);
	if (config.AUTH_AUDIENCE) jwt = jwt.setAudience(config.AUTH_AUDIENCE);
	return jwt.sign(new TextEncoder().encode(config.AUTH_JWT_SECRET));
}
