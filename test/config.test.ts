// Configuration: defaults as documented, bad values named, production strict about secrets,
// the embedded default generating its secrets once. Also the real entry point refusing to start.
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import tls from "node:tls";
import { ALL_SERVICES, ConfigError, EnvSchema, LEASES_PER_CONCURRENT_ATTEMPT, loadConfig, parseConfig, resolveSecrets } from "../lib/config";
import { maskedUrl, natsServerOptions } from "../lib/connection-urls";
import { ensureDevelopmentCertificates } from "../lib/dev-certificates";
import { makeNatsAccounts } from "./helpers/nats-accounts";
import { serviceCommand } from "./helpers/service-build";

const ROOT = path.resolve(__dirname, "..");
const KEY = Buffer.alloc(32, 1).toString("base64");
const JWT_SECRET = "s".repeat(40);
/** What a production notifier needs besides SECRETS_KEY: where links point, and mail to files chosen. */
const NOTIFIER_PRODUCTION = { PUBLIC_BASE_URL: "https://webhooks.example.com", SMTP_URL: "file:" };

function configError(env: Record<string, string>): string {
	try {
		loadConfig(env);
	} catch (err) {
		expect(err).toBeInstanceOf(ConfigError);
		return (err as Error).message;
	}
	throw new Error(`configuration ${JSON.stringify(env)} was accepted`);
}

function tempDir(): string {
	return fs.mkdtempSync(path.join(os.tmpdir(), "swh-config-"));
}

describe("configuration", () => {
	const dirs: string[] = [];
	const newDataDir = () => {
		const dir = tempDir();
		dirs.push(dir);
		return dir;
	};
	afterAll(() => dirs.forEach(dir => fs.rmSync(dir, { recursive: true, force: true })));

	it("defaults to the embedded mode with the documented values", () => {
		const config = parseConfig({});
		expect(config).toMatchObject({
			production: false,
			PORT: 3000,
			OPS_PORT: 3030,
			DATA_DIR: "./data",
			SERVICES: [...ALL_SERVICES],
			WEBHOOK_ALLOW_NETS: [],
			DELIVERY_RETRY_SCHEDULE: [60_000, 300_000, 1_800_000, 7_200_000, 21_600_000],
			DELIVERY_TIMEOUT: 15_000,
			WEBHOOK_TEST_TIMEOUT: 5_000,
			SECRET_ROTATION_GRACE: 24 * 3_600_000,
			DELIVERY_SENDER_THREADS: 1,
			WEBHOOK_DISABLE_AFTER: 5 * 24 * 3_600_000,
			INTAKE_ACK_WAIT: 60_000,
		});
		for (const unset of ["DATABASE_URL", "TRANSPORTER", "SMTP_URL", "AUTH_JWKS_URL", "WEBHOOK_CA_FILE"] as const) expect(config[unset]).toBeUndefined();
	});

	it("gives one origin the instance's whole delivery concurrency unless told otherwise, apart from the per-webhook limit", () => {
		expect(parseConfig({})).toMatchObject({ DELIVERY_CONCURRENCY: 64, DELIVERY_WEBHOOK_CONCURRENCY: 8, DELIVERY_ORIGIN_CONNECTIONS: 64 });
		expect(parseConfig({ DELIVERY_CONCURRENCY: "200" }).DELIVERY_ORIGIN_CONNECTIONS).toBe(200);
		expect(parseConfig({ DELIVERY_ORIGIN_CONNECTIONS: "16" })).toMatchObject({ DELIVERY_ORIGIN_CONNECTIONS: 16, DELIVERY_WEBHOOK_CONCURRENCY: 8 });
		expect(() => parseConfig({ DELIVERY_ORIGIN_CONNECTIONS: "0" })).toThrow(/DELIVERY_ORIGIN_CONNECTIONS/);
		expect(parseConfig({}).DELIVERY_MAX_LEASES).toBe(64 * LEASES_PER_CONCURRENT_ATTEMPT);
		expect(parseConfig({ DELIVERY_CONCURRENCY: "4" }).DELIVERY_MAX_LEASES).toBe(4 * LEASES_PER_CONCURRENT_ATTEMPT);
		expect(parseConfig({ DELIVERY_MAX_LEASES: "64", DELIVERY_CONCURRENCY: "64" }).DELIVERY_MAX_LEASES).toBe(64);
		expect(() => parseConfig({ DELIVERY_MAX_LEASES: "63" })).toThrow(/DELIVERY_MAX_LEASES: 63 is fewer than DELIVERY_CONCURRENCY \(64\)/);
		for (const bad of ["0", "-5", "1.5", "lots"]) expect(() => parseConfig({ DELIVERY_MAX_LEASES: bad })).toThrow(/DELIVERY_MAX_LEASES/);
	});

	it("treats an empty variable as unset, as shells and compose files do", () => {
		const config = parseConfig({ PORT: "", DATABASE_URL: "", SERVICES: "" });
		expect(config).toMatchObject({ PORT: 3000, SERVICES: [...ALL_SERVICES] });
		expect(config.DATABASE_URL).toBeUndefined();
	});

	it.each([
		["PORT", "not-a-port"],
		["PORT", "abc"],
		["PORT", "70000"],
		["PORT", "3000.5"],
		["OPS_PORT", "-1"],
		["DATABASE_URL", "mysql://db/webhooks"],
		["TRANSPORTER", "redis://localhost"],
		["SMTP_URL", "http://mail"],
		["SMTP_URL", "file:///var/mail"],
		["MAIL_FROM", "nobody"],
		["SECRETS_KEY", "dG9vIHNob3J0"],
		["AUTH_JWT_SECRET", "short"],
		["DELIVERY_TIMEOUT", "soon"],
		["RATE_LIMIT_PER_MINUTE", "0"],
		["LOG_LEVEL", "loud"],
		["WEBHOOK_ALLOW_NETS", "127.0.0.1/33"],
		["WEBHOOK_ALLOW_NETS", "10.0.0.0/8,localhost"],
		["WEBHOOK_CA_FILE", "/nonexistent.pem"],
		["SMTP_CA_FILE", "/nonexistent.pem"],
		["WEBHOOK_CA_FILE", __filename],
		["WEBHOOK_TEST_TIMEOUT", "5"],
		["DELIVERY_LEASE", "60 seconds"],
		["INTAKE_ACK_WAIT", "60"],
		["DELIVERY_SENDER_THREADS", "-1"],
		["DELIVERY_SENDER_THREADS", "17"],
		["DELIVERY_SENDER_THREADS", "1.5"],
		["STARTUP_CONNECT_TIMEOUT", "30"],
		["BACKLOG_REFRESH", "0s"],
		["RATE_LIMIT_PER_ADDRESS_PER_MINUTE", "many"],
	])("refuses %s=%s, naming the variable", (name, value) => {
		expect(configError({ [name]: value, DATA_DIR: newDataDir() })).toMatch(new RegExp(`^\\s*${name}: `, "m"));
	});

	it("says why a value is wrong, in plain words", () => {
		const dataDir = newDataDir();
		expect(configError({ WEBHOOK_ALLOW_NETS: "127.0.0.1/33", DATA_DIR: dataDir })).toMatch(/WEBHOOK_ALLOW_NETS: "127.0.0.1\/33" is not a CIDR range/);
		expect(configError({ WEBHOOK_CA_FILE: "/nonexistent.pem", DATA_DIR: dataDir })).toMatch(/WEBHOOK_CA_FILE: cannot read \/nonexistent.pem \(ENOENT\)/);
		expect(configError({ WEBHOOK_CA_FILE: __filename, DATA_DIR: dataDir })).toMatch(/WEBHOOK_CA_FILE: .* holds no PEM certificate/);
		// A bare number once meant milliseconds; now the unit is required.
		expect(configError({ WEBHOOK_TEST_TIMEOUT: "5", DATA_DIR: dataDir })).toMatch(/WEBHOOK_TEST_TIMEOUT: "5" has no unit \(use e.g. 500ms, 15s/);
		expect(parseConfig({ WEBHOOK_TEST_TIMEOUT: "5s", DELIVERY_TIMEOUT: "1.5s", MAIL_LEASE: "500ms" })).toMatchObject({ WEBHOOK_TEST_TIMEOUT: 5_000, DELIVERY_TIMEOUT: 1_500, MAIL_LEASE: 500 });
		// As plain as the durations, where zod alone said "expected number, received NaN".
		expect(configError({ PORT: "abc", DATA_DIR: dataDir })).toMatch(/^ {2}PORT: "abc" is not a whole number from 0 to 65535 \(0 picks a free port\)$/m);
		expect(configError({ MAIL_CONCURRENCY: "0", DATA_DIR: dataDir })).toMatch(/^ {2}MAIL_CONCURRENCY: "0" is not a whole number of at least 1$/m);
		expect(configError({ SMTP_URL: "file:///var/mail", DATA_DIR: dataDir })).toMatch(/SMTP_URL: must be an smtp:\/\/ or smtps:\/\/ URL with a host, or file: for \.eml files under DATA_DIR\/mail/);
		expect(parseConfig({ PORT: " 8080 ", OPS_PORT: "0", STARTUP_CONNECT_TIMEOUT: "2s" })).toMatchObject({ PORT: 8080, OPS_PORT: 0, STARTUP_CONNECT_TIMEOUT: 2_000 });
	});

	it("listens on loopback in development, and on every interface in production, unless HOST says otherwise", () => {
		expect(parseConfig({}).HOST).toBe("127.0.0.1");
		expect(parseConfig({ NODE_ENV: "test" }).HOST).toBe("127.0.0.1");
		expect(parseConfig({ NODE_ENV: "production" }).HOST).toBe("0.0.0.0");
		expect(parseConfig({ HOST: "0.0.0.0" }).HOST).toBe("0.0.0.0");
		expect(parseConfig({ NODE_ENV: "production", HOST: "10.1.2.3" }).HOST).toBe("10.1.2.3");
	});

	it.each([
		["1m,banana", /DELIVERY_RETRY_SCHEDULE: .*banana/],
		["5m,1m", /DELIVERY_RETRY_SCHEDULE: offsets must increase/],
		[",", /DELIVERY_RETRY_SCHEDULE: needs at least one offset/],
	])("refuses DELIVERY_RETRY_SCHEDULE=%s with a reason", (value, reason) => {
		expect(configError({ DELIVERY_RETRY_SCHEDULE: value, DATA_DIR: newDataDir() })).toMatch(reason);
	});

	it("accepts a short retry schedule for tests", () => {
		expect(parseConfig({ DELIVERY_RETRY_SCHEDULE: "1s, 2s,3s ,4s,5s" }).DELIVERY_RETRY_SCHEDULE).toEqual([1_000, 2_000, 3_000, 4_000, 5_000]);
	});

	it("refuses an unknown SERVICES entry, naming it and the known ones", () => {
		const message = configError({ SERVICES: "api,dispatcher,mailer", DATA_DIR: newDataDir() });
		expect(message).toMatch(/SERVICES: unknown service\(s\) mailer; known: api, topics, webhooks, users, dispatcher, notifier/);
		expect(parseConfig({ SERVICES: " dispatcher , notifier " }).SERVICES).toEqual(["dispatcher", "notifier"]);
	});

	it.each(["nats://bad host:4222", "nats://127.0.0.1:99999", "nats://", "http://127.0.0.1:4222", "nats://127.0.0.1:4222,http://127.0.0.1:4223", "nats://127.0.0.1:4222,"])("refuses TRANSPORTER %j at once, instead of waiting for a server it cannot name", transporter => {
		expect(configError({ TRANSPORTER: transporter })).toMatch(/^\s*TRANSPORTER: must be nats:\/\/host:port \(tls:\/\/host:port to demand TLS\), or several such URLs comma-separated \(entry \d is not\)$/m);
	});

	it("never echoes a refused TRANSPORTER, which may hold a password", () => {
		expect(configError({ TRANSPORTER: "nats://user:s3cret@bad host:4222" })).not.toContain("s3cret");
	});

	it("prints a NATS password or token as ***, and a database's user name as it is", () => {
		expect(maskedUrl("nats://user:s3cret@a:4222,tls://t0ken@b:4222,nats://c:4222")).toBe("nats://user:***@a:4222,tls://***@b:4222,nats://c:4222");
		expect(maskedUrl("postgres://postgres@db:5432/app")).toBe("postgres://postgres@db:5432/app");
	});

	it.each(["nats://127.0.0.1:4222", "nats://nats", "nats://a:4222, nats://user:p%40ss@b:4222", "tls://nats.example.com:4222", "tls://a:4222,tls://b:4222"])("accepts TRANSPORTER %j", transporter => {
		expect(parseConfig({ TRANSPORTER: transporter }).TRANSPORTER).toBe(transporter);
	});

	it("refuses a TRANSPORTER that mixes nats:// and tls:// servers, since TLS is one choice for the connection", () => {
		expect(configError({ TRANSPORTER: "tls://a:4222,nats://b:4222" })).toMatch(/^\s*TRANSPORTER: mixes nats:\/\/ and tls:\/\/ entries; TLS is one choice for every server/m);
	});

	describe("TLS and credentials for NATS", () => {
		const certificates = () => ensureDevelopmentCertificates(path.join(newDataDir(), "certificates"));

		it("takes a CA, and a certificate with its key, for a cluster node", () => {
			const { caFile, certFile, keyFile } = certificates();
			expect(parseConfig({ TRANSPORTER: "tls://nats:4222", NATS_CA_FILE: caFile, NATS_CERT_FILE: certFile, NATS_KEY_FILE: keyFile })).toMatchObject({ NATS_CA_FILE: caFile, NATS_CERT_FILE: certFile, NATS_KEY_FILE: keyFile });
		});

		it("refuses files that hold no certificate or no key, and a certificate without its key", () => {
			const { caFile, keyFile } = certificates();
			const message = configError({ TRANSPORTER: "nats://nats:4222", NATS_CA_FILE: keyFile, NATS_KEY_FILE: caFile, DATA_DIR: newDataDir() });
			expect(message).toMatch(/^ {2}NATS_CA_FILE: .*localhost-key\.pem holds no PEM certificate$/m);
			expect(message).toMatch(/^ {2}NATS_KEY_FILE: .*ca\.pem holds no PEM private key$/m);
			expect(message).toMatch(/^ {2}NATS_CERT_FILE: missing; NATS_CERT_FILE and NATS_KEY_FILE must be set together$/m);
			expect(configError({ TRANSPORTER: "nats://nats:4222", NATS_CERT_FILE: "/nonexistent.pem", DATA_DIR: newDataDir() })).toMatch(/NATS_CERT_FILE: cannot read \/nonexistent.pem \(ENOENT\)/);
		});

		it("takes a .creds file for decentralized auth, alone: not beside credentials in TRANSPORTER, nor a file that is no .creds", async () => {
			const { credsFile } = await makeNatsAccounts(path.join(newDataDir(), "accounts"));
			expect(parseConfig({ TRANSPORTER: "tls://connect.example.com", NATS_CREDS_FILE: credsFile }).NATS_CREDS_FILE).toBe(credsFile);
			expect(typeof natsServerOptions("tls://connect.example.com", { NATS_CREDS_FILE: credsFile }).authenticator).toBe("function");
			expect(configError({ TRANSPORTER: "nats://user:pass@nats:4222", NATS_CREDS_FILE: credsFile, DATA_DIR: newDataDir() })).toMatch(/^ {2}NATS_CREDS_FILE: set beside a user name, password or token in TRANSPORTER; a node logs in to NATS one way/m);
			expect(configError({ TRANSPORTER: "nats://nats:4222", NATS_CREDS_FILE: certificates().caFile, DATA_DIR: newDataDir() })).toMatch(/^ {2}NATS_CREDS_FILE: .*ca\.pem holds no NATS user JWT and NKey seed \(a \.creds file\)$/m);
		});

		it("refuses them on a node without TRANSPORTER, which opens no connection to NATS", () => {
			const { caFile } = certificates();
			expect(configError({ NATS_CA_FILE: caFile, DATA_DIR: newDataDir() })).toMatch(/^ {2}NATS_CA_FILE: set without TRANSPORTER; it is for the connection to NATS, which only a cluster node opens$/m);
		});

		it("gives nats.js TLS options when tls://, a CA or a certificate asks for TLS, the CA beside the public roots", () => {
			const { caFile, caPem, certFile, keyFile, cert, key } = certificates();
			expect(natsServerOptions("nats://u:p%40ss@a:4222,nats://b:4223")).toEqual({ servers: ["a:4222", "b:4223"], user: "u", pass: "p@ss" });
			// A user name alone is a token, as NATS's own tools read the URL.
			expect(natsServerOptions("tls://s3cr%2Ft@a:4222")).toEqual({ servers: ["a:4222"], token: "s3cr/t", tls: {} });
			expect(natsServerOptions(" TLS://a:4222")).toEqual({ servers: ["a:4222"], tls: {} });
			const withCa = natsServerOptions("nats://a:4222", { NATS_CA_FILE: caFile });
			expect(withCa.tls?.ca).toContain(caPem.trim());
			expect(withCa.tls?.ca).toContain(tls.rootCertificates[0]);
			expect(natsServerOptions("tls://a:4222", { NATS_CERT_FILE: certFile, NATS_KEY_FILE: keyFile }).tls).toEqual({ cert, key });
		});
	});

	it.each(["postgres://bad host/db", "postgres://127.0.0.1:99999/test", "mysql://127.0.0.1/test", "127.0.0.1:5432"])("refuses DATABASE_URL %j at once", databaseUrl => {
		expect(configError({ DATABASE_URL: databaseUrl })).toMatch(/^\s*DATABASE_URL: must be a postgres:\/\/user:password@host:port\/database URL$/m);
	});

	it.each(["postgres://postgres@127.0.0.1:5432/test", "postgresql://u:p%40ss@db/app?sslmode=require", "postgres:///app?host=/var/run/postgresql"])("accepts DATABASE_URL %j", databaseUrl => {
		expect(parseConfig({ DATABASE_URL: databaseUrl }).DATABASE_URL).toBe(databaseUrl);
	});

	it.each(["smtp://bad host:25", "smtp://127.0.0.1:99999", "smtp://", "http://mail.example.com"])("refuses SMTP_URL %j at once, instead of failing every email's attempts", smtpUrl => {
		expect(configError({ SMTP_URL: smtpUrl })).toMatch(/^\s*SMTP_URL: must be an smtp:\/\/ or smtps:\/\/ URL with a host/m);
	});

	it.each([
		["AUTH_JWKS_URL", "ftp://idp.example.com/jwks"],
		["PUBLIC_BASE_URL", "javascript:alert(1)"],
		["MAIL_PREFERENCES_URL", "mailto:ops@example.com"],
		["PUBLIC_BASE_URL", "not a url"],
	])("refuses %s=%j: the service fetches it or writes it into links, so it must be http:// or https://", (variable, value) => {
		expect(configError({ [variable]: value })).toMatch(new RegExp(`^\\s*${variable}: must be an http:// or https:// URL$`, "m"));
	});

	it.each(["prod", "staging"])("warns that NODE_ENV=%s runs as development, where only production is strict", nodeEnv => {
		const { config, warnings } = loadConfig({ NODE_ENV: nodeEnv, DATA_DIR: newDataDir() });
		expect(config.production).toBe(false);
		expect(warnings).toContainEqual(expect.stringMatching(new RegExp(`^NODE_ENV=${nodeEnv} is not production: this node runs as in development`)));
	});

	it.each(["development", "test"])("gives no NODE_ENV warning for %s", nodeEnv => {
		expect(loadConfig({ NODE_ENV: nodeEnv, DATA_DIR: newDataDir() }).warnings.filter(warning => warning.startsWith("NODE_ENV="))).toEqual([]);
	});

	it.each(["prod env", "a*b", "a>b", "x/y", ".leading", "trailing.", "a..b", "n".repeat(65)])("refuses NAMESPACE %j, which NATS subjects or JetStream stream names cannot hold", namespace => {
		expect(configError({ NAMESPACE: namespace })).toMatch(/^\s*NAMESPACE: must be /m);
	});

	it.each(["", "prod", "team-a.prod_2"])("accepts NAMESPACE %j", namespace => {
		expect(parseConfig({ NAMESPACE: namespace }).NAMESPACE).toBe(namespace);
	});

	it("names every bad variable at once", () => {
		const message = configError({ PORT: "x", DATABASE_URL: "sqlite://x", SERVICES: "nope", DATA_DIR: newDataDir() });
		for (const name of ["PORT", "DATABASE_URL", "SERVICES"]) expect(message).toMatch(new RegExp(`^\\s*${name}: `, "m"));
	});

	it("names every bad and every missing variable at once, however each is checked", () => {
		const dataDir = newDataDir();
		const message = configError({ NODE_ENV: "production", PORT: "abc", DELIVERY_RETRY_SCHEDULE: "5m,1m", MAIL_FROM: "nobody", OIDC_ISSUER: "https://id.example.com", DATA_DIR: dataDir });
		const named = [...message.matchAll(/^ {2}([A-Z_]+): /gm)].map(match => match[1]);
		expect(named.sort()).toEqual(["AUTH_JWT_SECRET", "DELIVERY_RETRY_SCHEDULE", "MAIL_FROM", "OIDC_CLIENT_ID", "PORT", "PUBLIC_BASE_URL", "SECRETS_KEY", "SMTP_URL"]);
		expect(message.split("\n")[0]).toBe("Invalid configuration:");
		expect(fs.readdirSync(dataDir)).toEqual([]);
	});

	describe("secrets", () => {
		it("in production, refuses to start without AUTH_JWT_SECRET and SECRETS_KEY, and writes nothing", () => {
			const dataDir = newDataDir();
			const production = { NODE_ENV: "production", DATA_DIR: dataDir, ...NOTIFIER_PRODUCTION };
			const message = configError(production);
			expect(message).toMatch(/^ {2}AUTH_JWT_SECRET: required with NODE_ENV=production .*, or AUTH_JWKS_URL instead$/m);
			expect(message).toMatch(/^ {2}SECRETS_KEY: required with NODE_ENV=production \(base64 of 32 bytes/m);
			expect(configError({ ...production, AUTH_JWT_SECRET: JWT_SECRET })).toMatch(/^Invalid configuration:\n {2}SECRETS_KEY: required[^\n]*$/);
			expect(configError({ ...production, SECRETS_KEY: KEY })).toMatch(/^Invalid configuration:\n {2}AUTH_JWT_SECRET: required[^\n]*$/);
			expect(fs.readdirSync(dataDir)).toEqual([]);
		});

		it("in production, starts with configured secrets, or JWKS instead of a shared secret", () => {
			const dataDir = newDataDir();
			const withSecret = loadConfig({ NODE_ENV: "production", DATA_DIR: dataDir, AUTH_JWT_SECRET: JWT_SECRET, SECRETS_KEY: KEY, ...NOTIFIER_PRODUCTION });
			expect(withSecret).toEqual({ config: expect.objectContaining({ AUTH_JWT_SECRET: JWT_SECRET, SECRETS_KEY: KEY }), warnings: [] });
			const withJwks = loadConfig({ NODE_ENV: "production", DATA_DIR: dataDir, AUTH_JWKS_URL: "https://login.example.com/.well-known/jwks.json", SECRETS_KEY: KEY, ...NOTIFIER_PRODUCTION });
			expect(withJwks.config.AUTH_JWT_SECRET).toBeUndefined();
			expect(fs.readdirSync(dataDir)).toEqual([]);
		});

		it("in the embedded default, generates them into DATA_DIR once, privately, and reuses them", () => {
			const dataDir = path.join(newDataDir(), "not-yet-created");
			const first = loadConfig({ DATA_DIR: dataDir });
			expect(first.warnings).toEqual([expect.stringMatching(/AUTH_JWT_SECRET.*SECRETS_KEY.*secrets\.json/)]);
			expect(Buffer.from(first.config.SECRETS_KEY!, "base64")).toHaveLength(32);
			expect(first.config.AUTH_JWT_SECRET!.length).toBeGreaterThanOrEqual(32);
			const file = path.join(dataDir, "secrets.json");
			expect(fs.statSync(file).mode & 0o777).toBe(0o600);
			const written = fs.readFileSync(file, "utf8");

			const second = loadConfig({ DATA_DIR: dataDir });
			expect(second.warnings).toEqual([]);
			expect({ jwt: second.config.AUTH_JWT_SECRET, key: second.config.SECRETS_KEY }).toEqual({ jwt: first.config.AUTH_JWT_SECRET, key: first.config.SECRETS_KEY });
			expect(fs.readFileSync(file, "utf8")).toBe(written);
		});

		it("asks each role only for the secrets it uses", () => {
			const dataDir = newDataDir();
			const production = { NODE_ENV: "production", DATA_DIR: dataDir };
			// The dispatcher checks no token and encrypts nothing; webhooks hand it decrypted secrets.
			expect(loadConfig({ ...production, SERVICES: "dispatcher" }).config).toMatchObject({ SERVICES: ["dispatcher"] });
			// The notifier signs unsubscribe links (SECRETS_KEY) but checks no bearer token.
			expect(configError({ ...production, ...NOTIFIER_PRODUCTION, SERVICES: "notifier" })).toMatch(/^Invalid configuration:\n {2}SECRETS_KEY: required[^\n]*$/);
			expect(loadConfig({ ...production, ...NOTIFIER_PRODUCTION, SERVICES: "notifier", SECRETS_KEY: KEY }).config.AUTH_JWT_SECRET).toBeUndefined();
			// The gateway alone checks tokens, and needs no SMTP settings.
			expect(configError({ ...production, SERVICES: "api" })).toMatch(/^Invalid configuration:\n {2}AUTH_JWT_SECRET: required[^\n]*$/);
			expect(loadConfig({ ...production, SERVICES: "api", AUTH_JWT_SECRET: JWT_SECRET }).config.SECRETS_KEY).toBeUndefined();
			expect(fs.readdirSync(dataDir)).toEqual([]);
		});

		it("in production, refuses a notifier that has no SMTP_URL unless files are chosen with SMTP_URL=file:, or no PUBLIC_BASE_URL", () => {
			const dataDir = newDataDir();
			const notifier = { NODE_ENV: "production", DATA_DIR: dataDir, SERVICES: "notifier", SECRETS_KEY: KEY };
			expect(configError(notifier)).toMatch(/^Invalid configuration:\n {2}PUBLIC_BASE_URL: required[^\n]*\n {2}SMTP_URL: required[^\n]*$/);
			expect(configError({ ...notifier, PUBLIC_BASE_URL: "https://webhooks.example.com" })).toMatch(/^Invalid configuration:\n {2}SMTP_URL: required with NODE_ENV=production when the notifier runs \(smtp:\/\/… or smtps:\/\/…\); file: writes emails as \.eml files under DATA_DIR\/mail instead$/);
			expect(configError({ ...notifier, SMTP_URL: "file:" })).toMatch(/^Invalid configuration:\n {2}PUBLIC_BASE_URL: required with NODE_ENV=production when the notifier runs: the address the links in emails point to$/);
			expect(loadConfig({ ...notifier, ...NOTIFIER_PRODUCTION }).config).toMatchObject({ SMTP_URL: "file:", PUBLIC_BASE_URL: NOTIFIER_PRODUCTION.PUBLIC_BASE_URL });
			expect(loadConfig({ ...notifier, PUBLIC_BASE_URL: "https://webhooks.example.com", SMTP_URL: "smtps://mailer:pw@smtp.example.com" }).config.SMTP_URL).toBe("smtps://mailer:pw@smtp.example.com");
			// Nodes without the notifier send no email, so they need neither.
			expect(loadConfig({ NODE_ENV: "production", DATA_DIR: dataDir, SERVICES: "dispatcher" }).config.SMTP_URL).toBeUndefined();
			// Outside production the embedded default writes .eml files without being asked.
			expect(loadConfig({ DATA_DIR: dataDir, SERVICES: "notifier" }).config.SMTP_URL).toBeUndefined();
		});

		it("prefers configured secrets over generated ones", () => {
			const dataDir = newDataDir();
			resolveSecrets(parseConfig({ DATA_DIR: dataDir }));
			const configured = loadConfig({ DATA_DIR: dataDir, AUTH_JWT_SECRET: JWT_SECRET, SECRETS_KEY: KEY }).config;
			expect({ jwt: configured.AUTH_JWT_SECRET, key: configured.SECRETS_KEY }).toEqual({ jwt: JWT_SECRET, key: KEY });
		});
	});

	it("bounds tokens and slow clients by default, and refuses bad values for those bounds", () => {
		expect(parseConfig({})).toMatchObject({
			AUTH_REQUIRE_CUSTOMER_CLAIM: false,
			AUTH_MAX_TOKEN_AGE: 24 * 3_600_000,
			HTTP_HEADERS_TIMEOUT: 15_000,
			HTTP_REQUEST_TIMEOUT: 20_000,
			HTTP_CONNECTIONS_PER_ADDRESS: 64,
		});
		expect(parseConfig({ AUTH_REQUIRE_CUSTOMER_CLAIM: "true", HTTP_CONNECTIONS_PER_ADDRESS: "0" })).toMatchObject({ AUTH_REQUIRE_CUSTOMER_CLAIM: true, HTTP_CONNECTIONS_PER_ADDRESS: 0 });
		const dataDir = newDataDir();
		expect(configError({ AUTH_REQUIRE_CUSTOMER_CLAIM: "yes", DATA_DIR: dataDir })).toMatch(/AUTH_REQUIRE_CUSTOMER_CLAIM: must be true or false/);
		expect(configError({ AUTH_MAX_TOKEN_AGE: "24", DATA_DIR: dataDir })).toMatch(/AUTH_MAX_TOKEN_AGE: "24" has no unit/);
		expect(configError({ HTTP_CONNECTIONS_PER_ADDRESS: "-1", DATA_DIR: dataDir })).toMatch(/HTTP_CONNECTIONS_PER_ADDRESS/);
	});

	it("reads the backlog at most every 5 s unless told otherwise, from 1 s to 5 min", () => {
		expect(parseConfig({}).BACKLOG_REFRESH).toBe(5_000);
		expect(parseConfig({ BACKLOG_REFRESH: "1s" }).BACKLOG_REFRESH).toBe(1_000);
		expect(parseConfig({ BACKLOG_REFRESH: "5m" }).BACKLOG_REFRESH).toBe(300_000);
		const dataDir = newDataDir();
		expect(configError({ BACKLOG_REFRESH: "500ms", DATA_DIR: dataDir })).toMatch(/^ {2}BACKLOG_REFRESH: "500ms" is not from 1s to 5m$/m);
		expect(configError({ BACKLOG_REFRESH: "1h", DATA_DIR: dataDir })).toMatch(/^ {2}BACKLOG_REFRESH: "1h" is not from 1s to 5m$/m);
		expect(configError({ BACKLOG_REFRESH: "30", DATA_DIR: dataDir })).toMatch(/^ {2}BACKLOG_REFRESH: "30" has no unit/m);
	});

	it("is documented in full: the table of docs/configuration.md lists exactly the variables the service reads", () => {
		const doc = fs.readFileSync(path.join(ROOT, "docs", "configuration.md"), "utf8");
		const section = doc.split(/^## /m).find(part => part.startsWith("Every variable\n"));
		expect(section).toBeDefined();
		const documented = [...section!.matchAll(/^\| `([A-Z][A-Z0-9_]*)` \|/gm)].map(match => match[1]);
		expect(new Set(documented).size).toBe(documented.length);
		expect([...documented].sort()).toEqual(Object.keys(EnvSchema.shape).sort());
	});

	describe("the server entry point", () => {
		function runServer(env: Record<string, string>): Promise<{ code: number | null; stderr: string; stdout: string }> {
			return new Promise((resolve, reject) => {
				// Unset what a developer's shell might carry, so only `env` decides.
				const clean = { DATABASE_URL: "", TRANSPORTER: "", SMTP_URL: "", AUTH_JWT_SECRET: "", SECRETS_KEY: "", AUTH_JWKS_URL: "", NODE_ENV: "" };
				const { command, args } = serviceCommand();
				const child = spawn(command, args, { cwd: ROOT, env: { ...process.env, ...clean, PORT: "0", OPS_PORT: "0", ...env } });
				let stderr = "";
				let stdout = "";
				child.stderr.on("data", chunk => (stderr += chunk));
				child.stdout.on("data", chunk => (stdout += chunk));
				const guard = setTimeout(() => {
					child.kill("SIGKILL");
					reject(new Error(`server.ts did not exit; stderr: ${stderr}`));
				}, 50_000);
				child.on("exit", code => {
					clearTimeout(guard);
					resolve({ code, stderr, stdout });
				});
			});
		}

		it("exits 78, naming every bad variable on stderr, before starting anything", async () => {
			const dataDir = newDataDir();
			const result = await runServer({ DATA_DIR: dataDir, DELIVERY_RETRY_SCHEDULE: "5m,1m", PORT: "not-a-port" });
			expect(result.code).toBe(78);
			expect(result.stderr).toMatch(/^\s*PORT: /m);
			expect(result.stderr).toMatch(/^\s*DELIVERY_RETRY_SCHEDULE: offsets must increase/m);
			expect(result.stdout).toBe("");
			expect(fs.readdirSync(dataDir)).toEqual([]);
		});

		it("exits 78 naming HOST, not the port, when HOST is not an address of this machine", async () => {
			// 203.0.113.0/24 is TEST-NET-3: documentation only, never a local address.
			const result = await runServer({ DATA_DIR: newDataDir(), HOST: "203.0.113.7", PORT: "0", OPS_PORT: "0" });
			expect(result.code).toBe(78);
			expect(result.stderr).toContain("Invalid configuration: HOST: 203.0.113.7 is not an address of this machine (EADDRNOTAVAIL)");
			expect(result.stderr).not.toMatch(/PORT: port/);
		});

		it("exits 78 in production without secrets, naming them", async () => {
			const result = await runServer({ NODE_ENV: "production", DATA_DIR: newDataDir() });
			expect(result.code).toBe(78);
			expect(result.stderr).toMatch(/SECRETS_KEY/);
			expect(result.stderr).toMatch(/AUTH_JWT_SECRET/);
		});
	});
});
