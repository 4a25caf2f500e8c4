// Starts the real service stack (real gateway on an ephemeral port, real database) for a test.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import crypto from "node:crypto";
import knex, { type Knex } from "knex";
import { createApp, type App } from "../../app";
import { parseConfig, resolveSecrets, type AppConfig, type ServiceName } from "../../lib/config";
import { mintToken, type TokenRequest } from "../../lib/auth";
import { TEST_DATABASE_URL, type DatabaseKind } from "./services";

export interface StackOptions {
	services?: ServiceName[];
	database?: DatabaseKind;
	env?: Record<string, string>;
	/** Reuse an existing data directory / schema (restart tests). */
	dataDir?: string;
	schema?: string;
}

export interface Stack {
	app: App;
	config: AppConfig;
	baseUrl: string;
	dataDir: string;
	schema?: string;
	/** A separate knex connection for assertions on what the services wrote. */
	db: Knex;
	token(sub: string, extra?: Omit<TokenRequest, "sub">): Promise<string>;
	request(method: string, urlPath: string, options?: RequestOptions): Promise<TestResponse>;
	/** Stops the services but keeps the data (for restart tests). */
	stopServices(): Promise<void>;
	/** Stops everything and removes the data. */
	stop(): Promise<void>;
}

export interface RequestOptions {
	token?: string;
	/** An object is sent as JSON; a string is sent as-is (for malformed bodies). */
	body?: unknown;
	headers?: Record<string, string>;
}

export interface TestResponse {
	status: number;
	headers: Headers;
	body: any;
	text: string;
}

export async function startStack(options: StackOptions = {}): Promise<Stack> {
	const dataDir = options.dataDir ?? fs.mkdtempSync(path.join(os.tmpdir(), "swh-test-"));
	const schema = options.database === "postgres" ? (options.schema ?? `t_${crypto.randomBytes(6).toString("hex")}`) : undefined;
	const env: Record<string, string> = {
		NODE_ENV: "test",
		PORT: "0",
		HOST: "127.0.0.1",
		DATA_DIR: dataDir,
		LOG_LEVEL: "warn",
		RATE_LIMIT_PER_MINUTE: "100000",
		SERVICES: (options.services ?? ["api", "topics", "webhooks", "users", "dispatcher", "notifier"]).join(","),
		...(schema ? { DATABASE_URL: TEST_DATABASE_URL, DATABASE_SCHEMA: schema } : {}),
		...options.env,
	};
	const config = parseConfig(env);
	resolveSecrets(config);
	const app = createApp(config, {
		broker: {
			logger: process.env.TEST_LOGS ? { type: "Console", options: { level: process.env.TEST_LOGS } } : false,
		},
	});
	await app.start();
	const port = app.apiPort();
	const baseUrl = `http://127.0.0.1:${port ?? 0}`;
	const db = schema
		? knex({ client: "pg", connection: TEST_DATABASE_URL, searchPath: [schema], pool: { min: 0, max: 2 } })
		: knex({ client: "better-sqlite3", connection: { filename: path.join(dataDir, "service.sqlite") }, useNullAsDefault: true });

	let servicesStopped = false;
	const stack: Stack = {
		app,
		config,
		baseUrl,
		dataDir,
		schema,
		db,
		token: (sub, extra = {}) => mintToken(config, { sub, ...extra }),
		async request(method, urlPath, requestOptions = {}) {
			const headers: Record<string, string> = { ...requestOptions.headers };
			if (requestOptions.token) headers.authorization = `Bearer ${requestOptions.token}`;
			let body: string | undefined;
			if (typeof requestOptions.body === "string") body = requestOptions.body;
			else if (requestOptions.body !== undefined) {
				body = JSON.stringify(requestOptions.body);
				headers["content-type"] ??= "application/json";
			}
			const response = await fetch(baseUrl + urlPath, { method, headers, body });
			const text = await response.text();
			let parsed: unknown = undefined;
			try {
				parsed = text ? JSON.parse(text) : undefined;
			} catch {
				parsed = text;
			}
			return { status: response.status, headers: response.headers, body: parsed, text };
		},
		async stopServices() {
			if (servicesStopped) return;
			servicesStopped = true;
			await app.stop();
		},
		async stop() {
			await stack.stopServices();
			if (schema && !options.schema) await db.raw(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
			await db.destroy();
			if (!options.dataDir) fs.rmSync(dataDir, { recursive: true, force: true });
		},
	};
	return stack;
}

// Each table's first column, to order its snapshot by, per database handle. Looked up once: on
// PostgreSQL, columnInfo reads information_schema.columns, which cost PostgreSQL more CPU than
// any other statement of the whole suite when it was read before and after every rejected request.
const orderColumns = new WeakMap<Knex, Map<string, Promise<string>>>();

function orderColumnOf(db: Knex, table: string): Promise<string> {
	let columns = orderColumns.get(db);
	if (!columns) orderColumns.set(db, (columns = new Map()));
	let column = columns.get(table);
	if (!column) {
		column = db(table).columnInfo().then(info => Object.keys(info)[0]);
		columns.set(table, column);
	}
	return column;
}

/** A snapshot of every table's rows, to prove that a rejected request changed nothing. */
export async function snapshotTables(db: Knex, tables: string[]): Promise<Record<string, unknown[]>> {
	const snapshot: Record<string, unknown[]> = {};
	for (const table of tables) snapshot[table] = await db(table).select().orderBy(await orderColumnOf(db, table));
	return snapshot;
}

export function expectProblem(response: TestResponse, status: number): void {
	expect({ status: response.status, contentType: response.headers.get("content-type") }).toEqual({
		status,
		contentType: expect.stringContaining("application/problem+json"),
	});
	expect(response.body).toMatchObject({ type: expect.any(String), title: expect.any(String), status, detail: expect.any(String) });
}

export type Rejection = (method: string, urlPath: string, options: RequestOptions, status: number) => Promise<TestResponse>;

/**
 * `rejected(method, path, options, status)`: sends the request, checks the problem answer, and
 * proves that the listed tables did not change. Every status seen is pushed to `statuses`, so a
 * suite can assert that none was a 5xx.
 */
export function rejectionCheck(stack: () => Stack, tables: string[], statuses: number[]): Rejection {
	return async (method, urlPath, options, status) => {
		const before = await snapshotTables(stack().db, tables);
		const response = await stack().request(method, urlPath, options);
		statuses.push(response.status);
		expectProblem(response, status);
		expect(await snapshotTables(stack().db, tables)).toEqual(before);
		return response;
	};
}
