// An empty database of either engine, for a test that migrates or seeds it by hand: a SQLite file
// in a directory of its own, or a schema of its own on the test PostgreSQL. `dataDir` and `schema`
// are what startStack takes to run services on the same data.
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import knex, { type Knex } from "knex";
import { TEST_DATABASE_URL, type DatabaseKind } from "./services";

export interface ScratchDatabase {
	db: Knex;
	dataDir: string;
	schema?: string;
	/** Drops the schema or the directory, and closes the connections. */
	drop(): Promise<void>;
}

export async function scratchDatabase(database: DatabaseKind, name: string): Promise<ScratchDatabase> {
	const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), `swh-${name}-`));
	let schema: string | undefined;
	let db: Knex;
	if (database === "postgres") {
		schema = `t_${crypto.randomBytes(6).toString("hex")}`;
		const admin = knex({ client: "pg", connection: TEST_DATABASE_URL, pool: { min: 0, max: 1 } });
		await admin.raw(`CREATE SCHEMA "${schema}"`);
		await admin.destroy();
		db = knex({ client: "pg", connection: TEST_DATABASE_URL, searchPath: [schema], pool: { min: 0, max: 2 } });
	} else {
		db = knex({ client: "better-sqlite3", connection: { filename: path.join(dataDir, "service.sqlite") }, useNullAsDefault: true });
	}
	return {
		db,
		dataDir,
		schema,
		async drop() {
			if (schema) await db.raw(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
			await db.destroy();
			fs.rmSync(dataDir, { recursive: true, force: true });
		},
	};
}
