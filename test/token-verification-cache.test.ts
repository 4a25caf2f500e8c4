// The gateway keeps successful token verifications (lib/auth.ts) so that a client's every request
// does not verify the same signature again. With a JWKS that must be exactly as strict as
// verifying each time: once the key set has been reloaded without the token's key, the token is
// refused even though its verification was kept. A real key set is served over loopback HTTP.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { exportJWK, generateKeyPair, SignJWT, type JWK, type KeyLike } from "jose";
import { createTokenVerifier, type TokenVerifier } from "../lib/auth";
import { parseConfig } from "../lib/config";

interface SigningKey {
	kid: string;
	privateKey: KeyLike;
	jwk: JWK;
}

async function signingKey(kid: string): Promise<SigningKey> {
	const { privateKey, publicKey } = await generateKeyPair("ES256");
	return { kid, privateKey, jwk: { ...(await exportJWK(publicKey)), kid, alg: "ES256", use: "sig" } };
}

const sign = (key: SigningKey, sub: string) =>
	new SignJWT({}).setProtectedHeader({ alg: "ES256", kid: key.kid }).setSubject(sub).setIssuedAt().setExpirationTime("1h").sign(key.privateKey);

describe("kept token verifications with a JWKS", () => {
	let server: http.Server;
	let served: SigningKey[];
	let fetches: number;
	let verify: TokenVerifier;
	let first: SigningKey;
	let second: SigningKey;
	let clockOffsetMs: number;

	beforeAll(async () => {
		[first, second] = await Promise.all([signingKey("first"), signingKey("second")]);
		server = http.createServer((_req, res) => {
			fetches++;
			res.setHeader("Content-Type", "application/json");
			res.end(JSON.stringify({ keys: served.map(key => key.jwk) }));
		});
		await new Promise<void>(resolve => server.listen(0, "127.0.0.1", resolve));
	});

	afterAll(() => new Promise(resolve => server.close(resolve)));

	beforeEach(() => {
		served = [first];
		fetches = 0;
		clockOffsetMs = 0;
		// The key set's reload rules (30 s between reloads for unknown keys) and the kept
		// verifications (a minute at most) read Date.now: move it instead of waiting.
		const realNow = Date.now.bind(Date);
		jest.spyOn(Date, "now").mockImplementation(() => realNow() + clockOffsetMs);
		const { port } = server.address() as AddressInfo;
		verify = createTokenVerifier(parseConfig({ AUTH_JWKS_URL: `http://127.0.0.1:${port}/jwks`, AUTH_ALGORITHMS: "ES256" }));
	});

	afterEach(() => jest.restoreAllMocks());

	it("keeps a verification without fetching the key set again", async () => {
		const token = await sign(first, "alice");
		expect((await verify(token)).userId).toBe("alice");
		expect((await verify(token)).userId).toBe("alice");
		expect(fetches).toBe(1);
	});

	it("refuses a kept token once the key set was reloaded without its key", async () => {
		const rotatedOut = await sign(first, "alice");
		expect((await verify(rotatedOut)).userId).toBe("alice");

		served = [second];
		clockOffsetMs = 31_000; // past the key set's cool-down, within the minute a verification is kept
		// A token with the new key makes the key set reload.
		expect((await verify(await sign(second, "bob"))).userId).toBe("bob");
		expect(fetches).toBe(2);

		await expect(verify(rotatedOut)).rejects.toMatchObject({ code: 401, message: "Token key is unknown" });
	});

	it("still accepts a kept token whose key survived the reload", async () => {
		const token = await sign(first, "alice");
		await verify(token);

		served = [first, second];
		clockOffsetMs = 31_000;
		await verify(await sign(second, "bob"));
		expect(fetches).toBe(2);

		expect((await verify(token)).userId).toBe("alice");
	});
});
