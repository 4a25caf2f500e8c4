// docker-compose.yml and the Dockerfile, checked without a Docker engine: the structure, and the
// application environment run through the real configuration parser, so that a compose file
// the service would refuse to start with fails here first.
import fs from "node:fs";
import path from "node:path";
import { parse } from "yaml";
import { ALL_SERVICES, loadConfig, parseConfig, resolveSecrets } from "../lib/config";

const ROOT = path.resolve(__dirname, "..");
const APP_SERVICES = ["gateway", "dispatcher", "notifier"] as const;
const SECRET_NAME = /SECRET|PASSWORD|_KEY$|TOKEN/;
// A whole-value compose interpolation: ${NAME}, ${NAME:?message}, ${NAME:-default}.
const INTERPOLATION = /\$\{([A-Z0-9_]+)(?:(:?[?-])([^}]*))?\}/g;

interface ComposeService {
	image?: string;
	build?: unknown;
	command?: string[] | string;
	environment?: Record<string, string>;
	depends_on?: Record<string, { condition: string }>;
	ports?: string[];
	healthcheck?: { test: string[] };
	container_name?: string;
}

interface ComposeFile {
	services: Record<string, ComposeService>;
	volumes?: Record<string, unknown>;
}

const compose = parse(fs.readFileSync(path.join(ROOT, "docker-compose.yml"), "utf8"), { merge: true }) as ComposeFile;

/** Substitutes ${...} as docker compose would, with `provided` as the operator's .env. */
function interpolate(text: string, provided: Record<string, string>): string {
	return text.replace(INTERPOLATION, (_whole, name: string, operator: string | undefined, argument: string | undefined) => {
		const value = provided[name];
		if (value !== undefined && value !== "") return value;
		if (operator?.endsWith("?")) throw new Error(`compose would refuse to start: ${name} is required (${argument})`);
		return argument ?? "";
	});
}

const OPERATOR_ENV = {
	POSTGRES_PASSWORD: "a-password-chosen-by-the-operator",
	SECRETS_KEY: Buffer.alloc(32, 7).toString("base64"),
	AUTH_JWT_SECRET: "x".repeat(48),
};

function environmentOf(service: string, provided: Record<string, string> = OPERATOR_ENV): Record<string, string> {
	const raw = compose.services[service].environment ?? {};
	return Object.fromEntries(Object.entries(raw).map(([name, value]) => [name, interpolate(String(value), provided)]));
}

describe("docker-compose.yml", () => {
	it("defines the three application roles, PostgreSQL, NATS and a mail catcher", () => {
		expect(Object.keys(compose.services)).toEqual(expect.arrayContaining([...APP_SERVICES, "postgres", "nats", "mailpit"]));
		for (const name of APP_SERVICES) expect(compose.services[name].build).toBe(".");
		for (const name of ["postgres", "nats", "mailpit"]) expect(compose.services[name].image).toMatch(/^[\w./-]+:[\w.-]+$/);
	});

	it.each(APP_SERVICES)("gives %s an environment the service accepts as production configuration", service => {
		const env = environmentOf(service);
		const config = parseConfig(env);
		expect(config.production).toBe(true);
		expect(config.TRANSPORTER).toBe("nats://nats:4222");
		expect(new URL(config.DATABASE_URL!).hostname).toBe("postgres");
		expect(new URL(config.SMTP_URL!).hostname).toBe("mailpit");
		// The notifier refuses to start in production without the address its email links point to.
		expect(config.PUBLIC_BASE_URL).toMatch(/^https?:\/\//);
		// Production refuses to start without its secrets and the notifier's mail settings; with the
		// operator's .env it has them all.
		expect(() => loadConfig(env)).not.toThrow();
	});

	it("splits every service across the roles, with the dispatcher and notifier on their own", () => {
		const servicesByRole = Object.fromEntries(APP_SERVICES.map(role => [role, parseConfig(environmentOf(role)).SERVICES]));
		expect(servicesByRole).toEqual({
			gateway: ["api", "topics", "webhooks", "users"],
			dispatcher: ["dispatcher"],
			notifier: ["notifier"],
		});
		expect(Object.values(servicesByRole).flat().sort()).toEqual([...ALL_SERVICES].sort());
	});

	it("starts the application only once PostgreSQL and NATS are healthy", () => {
		for (const name of APP_SERVICES) {
			expect(compose.services[name].depends_on).toMatchObject({
				postgres: { condition: "service_healthy" },
				nats: { condition: "service_healthy" },
			});
		}
		expect(compose.services.postgres.healthcheck?.test).toEqual(expect.arrayContaining(["pg_isready"]));
		expect(compose.services.nats.healthcheck?.test.join(" ")).toContain("/healthz");
	});

	it("checks each application container's health on OPS_PORT /health", () => {
		for (const name of APP_SERVICES) {
			const env = environmentOf(name);
			const check = compose.services[name].healthcheck?.test.join(" ") ?? "";
			expect(check).toContain("/health");
			expect(check).toContain("process.env.OPS_PORT");
			expect(parseConfig(env).OPS_PORT).toBe(3030);
		}
	});

	it("publishes the gateway's PORT and keeps the dispatcher scalable (no host port, no fixed name)", () => {
		const gatewayConfig = parseConfig(environmentOf("gateway"));
		const gatewayPort = gatewayConfig.PORT;
		// Production listens on every interface of the container, or the published port reaches nothing.
		expect(gatewayConfig.HOST).toBe("0.0.0.0");
		expect(compose.services.gateway.ports).toContain(`${gatewayPort}:${gatewayPort}`);
		expect(compose.services.gateway.ports).toContain("127.0.0.1:3030:3030");
		expect(compose.services.dispatcher.ports).toBeUndefined();
		expect(compose.services.dispatcher.container_name).toBeUndefined();
	});

	it("runs NATS with JetStream and keeps its data and PostgreSQL's in volumes", () => {
		expect(compose.services.nats.command).toContain("-js");
		expect(Object.keys(compose.volumes ?? {})).toEqual(expect.arrayContaining(["postgres-data", "nats-data"]));
	});

	it("hard-codes no secret: each comes from the operator's environment, without a default", () => {
		for (const [name, service] of Object.entries(compose.services)) {
			for (const [variable, value] of Object.entries(service.environment ?? {})) {
				if (!SECRET_NAME.test(variable)) continue;
				const defaults = [...String(value).matchAll(INTERPOLATION)].filter(match => match[2] === ":-" && match[3] !== "");
				expect({ service: name, variable, value: String(value).replace(INTERPOLATION, "") }).toEqual({ service: name, variable, value: "" });
				expect({ service: name, variable, defaults: defaults.length }).toEqual({ service: name, variable, defaults: 0 });
			}
		}
		const databaseUrl = String(compose.services.gateway.environment?.DATABASE_URL);
		expect(new URL(interpolate(databaseUrl, { ...OPERATOR_ENV, POSTGRES_PASSWORD: "p" })).password).toBe("p");
	});

	it("refuses to start when the operator has not provided the secrets", () => {
		expect(() => environmentOf("gateway", {})).toThrow(/POSTGRES_PASSWORD|SECRETS_KEY/);
		expect(() => environmentOf("dispatcher", { POSTGRES_PASSWORD: "p" })).toThrow(/SECRETS_KEY is required/);
		// Without AUTH_JWT_SECRET (nor AUTH_JWKS_URL) the service itself stops, naming it.
		const withoutAuth = parseConfig(environmentOf("gateway", { POSTGRES_PASSWORD: "p", SECRETS_KEY: OPERATOR_ENV.SECRETS_KEY }));
		expect(() => resolveSecrets(withoutAuth)).toThrow(/AUTH_JWT_SECRET/);
	});
});

describe("Dockerfile", () => {
	const instructions = fs
		.readFileSync(path.join(ROOT, "Dockerfile"), "utf8")
		.replace(/\\\n/g, " ")
		.split("\n")
		.map(line => line.trim())
		.filter(line => line && !line.startsWith("#"));

	const stages = instructions.join("\n").split(/^(?=FROM )/m);
	const final = stages[stages.length - 1];

	it("builds every stage on the current Node LTS (24), installs with npm ci and runs the compiled server itself (not npm, which keeps SIGTERM from it)", () => {
		const bases = instructions.filter(line => line.startsWith("FROM "));
		expect(bases.length).toBeGreaterThanOrEqual(2);
		for (const base of bases) expect(base).toMatch(/^FROM node:24\b/);
		expect(instructions).toContainEqual(expect.stringMatching(/^RUN npm ci\b/));
		expect(instructions[instructions.length - 1]).toBe('CMD ["node", "dist/server.js"]');
	});

	it("compiles with `npm run build` in the build stage, and ships only dist/ and the built web app with production dependencies", () => {
		expect(stages[0]).toMatch(/^RUN npm run build\b/m);
		expect(final).toMatch(/^RUN npm ci --omit=dev$/m);
		expect(final).toMatch(/^COPY --from=build \/build\/dist \.\/dist$/m);
		expect(final).toMatch(/^COPY --from=build \/build\/web\/dist \.\/web\/dist$/m);
		// The build checks the native SQLite addon it got, once dist/ (which holds the check) is in.
		expect(final.indexOf("sqliteAddonProblem")).toBeGreaterThan(final.indexOf("COPY --from=build /build/dist"));
		// No TypeScript source reaches the final image: only package files and the prepare script.
		const copied = [...final.matchAll(/^COPY (?!--from)(.+) \S+$/gm)].flatMap(match => match[1].split(" "));
		expect(copied.sort()).toEqual([".npmrc", "package-lock.json", "package.json", "scripts/build-web.ts", "sdk/package.json"]);
	});

	it("listens on every interface of the container, whatever NODE_ENV a `docker run -e` gives it", () => {
		const env = instructions.find(line => line.startsWith("ENV "));
		expect(env).toMatch(/\bHOST=0\.0\.0\.0\b/);
		expect(env).toMatch(/\bNODE_ENV=production\b/);
	});

	it("runs as an unprivileged user and checks health on OPS_PORT", () => {
		expect(instructions).toContain("USER node");
		expect(instructions.find(line => line.startsWith("HEALTHCHECK"))).toMatch(/OPS_PORT.*\/health/);
	});
});
