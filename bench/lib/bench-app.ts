// The service stack for in-process benchmarks: a throw-away DATA_DIR (SQLite) or, with
// BENCH_DATABASE_URL=postgres://…, a throw-away schema, plus a separate knex connection for the
// benchmark's own reads and seeding.
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import knex, { type Knex } from "knex";
import { createApp, type App } from "../../app";
import { parseConfig, resolveSecrets } from "../../lib/config";

export interface BenchApp {
	app: App;
	db: Knex;
	stop(): Promise<void>;
}

export async function startBenchApp(env: Record<string, string>): Promise<BenchApp> {
	const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-bench-"));
	const databaseUrl = process.env.BENCH_DATABASE_URL;
	const schema = databaseUrl ? `bench_${crypto.randomBytes(4).toString("hex")}` : undefined;
	const config = parseConfig({
		NODE_ENV: "bench",
		DATA_DIR: dataDir,
		LOG_LEVEL: "error",
		...env,
		...(databaseUrl ? { DATABASE_URL: databaseUrl, DATABASE_SCHEMA: schema } : {}),
	});
	resolveSecrets(config);
	const app = createApp(config, { broker: { logger: false } });
	await app.start();
	const db = databaseUrl
		? knex({ client: "pg", connection: databaseUrl, searchPath: [schema!], pool: { min: 0, max: 2 } })
		: knex({ client: "better-sqlite3", connection: { filename: path.join(dataDir, "service.sqlite") }, useNullAsDefault: true });
	return {
		app,
		db,
		async stop() {
			await app.stop();
			if (schema) await db.raw(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
			await db.destroy();
			fs.rmSync(dataDir, { recursive: true, force: true });
		},
	};
}
