// Webhook secrets at rest: never stored, logged or answered in clear except by create and
// rotate; the stored envelope opens only with the configured key and its own webhook id.
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";
import { decryptSecret, encryptSecret } from "../lib/crypto";
import { startStack, type Stack } from "./helpers/stack";
import { testDatabases } from "./helpers/services";

const ORDER_STATUS = "tasking:order_status";

/** Every form in which a secret could leak: as given, its base64 body, and the raw bytes as hex. */
function leakForms(secret: string): string[] {
	const body = secret.slice("whsec_".length);
	return [secret, body, Buffer.from(body, "base64").toString("hex"), Buffer.from(body, "base64").toString("base64url")];
}

async function allTables(stack: Stack): Promise<string[]> {
	if (stack.schema) {
		const rows: Array<{ table_name: string }> = await stack.db("information_schema.tables").where({ table_schema: stack.schema }).select("table_name");
		return rows.map(row => row.table_name);
	}
	const rows: Array<{ name: string }> = await stack.db("sqlite_master").where({ type: "table" }).select("name");
	return rows.map(row => row.name);
}

/** Every value of every column of every row of every table, as text. */
async function everyStoredValue(stack: Stack): Promise<string[]> {
	const values: string[] = [];
	for (const table of await allTables(stack)) {
		const rows: Array<Record<string, unknown>> = await stack.db(table).select();
		for (const row of rows) for (const value of Object.values(row)) values.push(value instanceof Buffer ? value.toString("latin1") : String(value));
	}
	return values;
}

function filesUnder(dir: string): string[] {
	return fs.readdirSync(dir, { withFileTypes: true }).flatMap(entry => (entry.isDirectory() ? filesUnder(path.join(dir, entry.name)) : [path.join(dir, entry.name)]));
}

describe.each(testDatabases())("webhook secrets on %s", database => {
	let stack: Stack;
	let token: string;
	const logLines: string[] = [];
	const responses: string[] = [];
	let created: { id: string; secret: string };
	let rotatedSecret: string;
	let second: { id: string; secret: string };
	const allSecrets = () => [created.secret, rotatedSecret, second.secret];

	beforeAll(async () => {
		// Capture the services' own log output at the most talkative level.
		for (const method of ["log", "info", "warn", "error", "debug", "trace"] as const) {
			jest.spyOn(console, method).mockImplementation((...args: unknown[]) => {
				logLines.push(args.map(arg => (arg instanceof Error ? `${arg.message} ${arg.stack}` : typeof arg === "string" ? arg : JSON.stringify(arg))).join(" "));
			});
		}
		const previousLogSetting = process.env.TEST_LOGS;
		process.env.TEST_LOGS = "trace";
		try {
			stack = await startStack({ services: ["api", "topics", "webhooks"], database });
		} finally {
			if (previousLogSetting === undefined) delete process.env.TEST_LOGS;
			else process.env.TEST_LOGS = previousLogSetting;
		}
		token = await stack.token("sasha");

		const response = await stack.request("POST", "/id/v3/webhooks", { token, body: { name: "secret keeper", url: "https://keeper.example.com/in", events: [ORDER_STATUS] } });
		expect(response.status).toBe(201);
		created = response.body;
		const rotated = await stack.request("POST", `/id/v3/webhooks/${created.id}/rotate`, { token });
		expect(rotated.status).toBe(200);
		rotatedSecret = rotated.body.secret;
		second = (await stack.request("POST", "/id/v3/webhooks", { token, body: { name: "second", url: "https://second.example.com/in", events: [ORDER_STATUS] } })).body;

		// Every other route that shows the webhook.
		for (const [method, route, body] of [
			["GET", `/id/v3/webhooks/${created.id}`],
			["GET", "/id/v3/webhooks"],
			["PATCH", `/id/v3/webhooks/${created.id}`, { name: "secret keeper 2" }],
			["PATCH", `/id/v3/webhooks/${created.id}`, { url: "https://elsewhere.example.com/" }],
			// A refused create (the name was just taken) must not hand out a secret either.
			["POST", "/id/v3/webhooks", { name: "secret keeper 2", url: "https://other.example.com/in", events: [ORDER_STATUS] }],
		] as Array<[string, string, object?]>) {
			responses.push((await stack.request(method, route, { token, body })).text);
		}
		// The dispatcher's view of the secrets is in clear by design, but must not be logged.
		await stack.app.broker.call("webhooks.subscribers", { customerId: "~sasha", topic: ORDER_STATUS });
		await stack.app.broker.call("webhooks.resolve", { ids: [created.id] });
	});
	afterAll(async () => {
		await stack?.stop();
		jest.restoreAllMocks();
	});

	it("issues distinct 32-byte secrets on create and rotate", () => {
		expect(created.secret).not.toBe(rotatedSecret);
		expect(new Set(allSecrets()).size).toBe(3);
		for (const secret of allSecrets()) {
			expect(secret).toMatch(/^whsec_/);
			expect(Buffer.from(secret.slice(6), "base64")).toHaveLength(32);
		}
	});

	it("stores no secret in clear in any column of any row of any table", async () => {
		const values = await everyStoredValue(stack);
		expect(values.length).toBeGreaterThan(0);
		for (const secret of allSecrets()) {
			for (const form of leakForms(secret)) {
				expect(values.filter(value => value.includes(form))).toEqual([]);
			}
		}
	});

	it("leaves no secret in clear in any file under the data directory", () => {
		const files = filesUnder(stack.dataDir);
		if (database === "sqlite") expect(files.some(file => file.endsWith("service.sqlite"))).toBe(true);
		for (const file of files) {
			const content = fs.readFileSync(file).toString("latin1");
			for (const secret of allSecrets()) {
				for (const form of leakForms(secret)) expect({ file, leaked: content.includes(form) }).toEqual({ file, leaked: false });
			}
		}
	});

	it("shows no secret in any other response", () => {
		expect(responses).toHaveLength(5);
		for (const text of responses) {
			expect(text).not.toContain("whsec_");
			for (const secret of allSecrets()) for (const form of leakForms(secret)) expect(text).not.toContain(form);
		}
	});

	it("writes no secret to the logs, even at trace level", () => {
		// The capture works: the services did log.
		expect(logLines.some(line => line.includes("webhooks"))).toBe(true);
		for (const secret of allSecrets()) {
			for (const form of leakForms(secret)) expect(logLines.filter(line => line.includes(form))).toEqual([]);
		}
	});

	it("stores envelopes that open only with the configured key and their own webhook id", async () => {
		const row = await stack.db("webhooks").where({ id: created.id }).first();
		const key = stack.config.SECRETS_KEY!;
		expect(decryptSecret(row.secret_envelope, key, created.id)).toBe(rotatedSecret);
		// The replaced secret is kept, encrypted the same way, for the rotation grace period.
		expect(decryptSecret(row.previous_secret_envelope, key, created.id)).toBe(created.secret);
		expect(Date.parse(row.previous_secret_expires_at)).toBeGreaterThan(Date.parse(row.updated_at));

		const otherKey = crypto.randomBytes(32).toString("base64");
		expect(() => decryptSecret(row.secret_envelope, otherKey, created.id)).toThrow();
		expect(() => decryptSecret(row.secret_envelope, key, crypto.randomUUID())).toThrow();
		// An envelope copied onto another webhook's row does not open there.
		expect(() => decryptSecret(row.secret_envelope, key, second.id)).toThrow();
		// A tampered envelope does not open either.
		const parts = row.secret_envelope.split(":");
		const flipped = Buffer.from(parts[3], "base64");
		flipped[0] ^= 1;
		expect(() => decryptSecret([...parts.slice(0, 3), flipped.toString("base64")].join(":"), key, created.id)).toThrow();
		// Sanity: the same plaintext encrypts differently each time (random IV).
		expect(encryptSecret(rotatedSecret, key, created.id)).not.toBe(row.secret_envelope);
	});

	it("fails loudly, without revealing anything, when the service runs with another key", async () => {
		// Simulates a wrong SECRETS_KEY: the row's envelope cannot be opened by the dispatcher's action.
		const row = await stack.db("webhooks").where({ id: created.id }).first();
		const foreign = encryptSecret("whsec_" + crypto.randomBytes(32).toString("base64"), crypto.randomBytes(32).toString("base64"), created.id);
		await stack.db("webhooks").where({ id: created.id }).update({ secret_envelope: foreign });
		try {
			await expect(stack.app.broker.call("webhooks.resolve", { ids: [created.id] })).rejects.toThrow(/does not decrypt: is SECRETS_KEY the key/);
		} finally {
			await stack.db("webhooks").where({ id: created.id }).update({ secret_envelope: row.secret_envelope });
		}
	});
});
