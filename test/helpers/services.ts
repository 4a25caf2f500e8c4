// Which external servers the suites can use. In CI (CI=true) PostgreSQL and NATS must be up:
// a suite that needs them fails rather than skips. On a laptop without them it skips, saying so.
import net from "node:net";
import knex, { type Knex } from "knex";

export const TEST_DATABASE_URL = process.env.TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
export const TEST_NATS_URL = process.env.TEST_NATS_URL ?? "nats://127.0.0.1:4222";

/** Runs `work` on a connection of its own to the shared PostgreSQL's test database, closed after. */
async function withAdminConnection<T>(work: (admin: Knex) => Promise<T>): Promise<T> {
	const admin = knex({ client: "pg", connection: TEST_DATABASE_URL, pool: { min: 0, max: 1 } });
	try {
		return await work(admin);
	} finally {
		await admin.destroy();
	}
}

/** Drops a schema a test made on the shared PostgreSQL, with everything in it, through a connection of its own. */
export async function dropTestSchema(schema: string): Promise<void> {
	await withAdminConnection(admin => admin.raw(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`));
}

// The suites create and drop hundreds of schemas in the database "test" per run. On a server with
// autovacuum off, as on the CI machine, the dead rows that leaves in the system catalogs are never
// removed, and every read of them (a new connection's first queries, DDL, information_schema) gets
// slower run after run: pg_attribute had grown to 57 MB, 230,000 dead rows beside 247 live ones.
const CATALOG_COMPACTION_BYTES = 8 * 1024 * 1024;

/** Compacts the test database's system catalogs once they have grown past CATALOG_COMPACTION_BYTES. */
export async function compactTestCatalogs(): Promise<void> {
	try {
		await withAdminConnection(async admin => {
			const { rows } = await admin.raw<{ rows: Array<{ bytes: string }> }>("SELECT pg_total_relation_size('pg_catalog.pg_attribute') AS bytes");
			if (Number(rows[0].bytes) <= CATALOG_COMPACTION_BYTES) return;
			// Not worth a hang: a session left holding a lock here only means a slower run.
			await admin.raw("SET lock_timeout = '10s'");
			await admin.raw("VACUUM FULL");
		});
	} catch (error) {
		console.warn(`Could not compact the test database's catalogs, continuing: ${(error as Error).message}`);
	}
}

function canConnect(url: string, defaultPort: number): Promise<boolean> {
	const { hostname, port } = new URL(url);
	return new Promise(resolve => {
		const socket = net.connect({ host: hostname, port: Number(port || defaultPort) });
		const done = (ok: boolean) => {
			socket.destroy();
			resolve(ok);
		};
		socket.setTimeout(1_000, () => done(false));
		socket.once("connect", () => done(true));
		socket.once("error", () => done(false));
	});
}

const inCi = process.env.CI === "true" || process.env.CI === "1";

async function required(name: string, url: string, port: number): Promise<boolean> {
	if (await canConnect(url, port)) return true;
	if (inCi) throw new Error(`${name} is not reachable at ${url}, and CI requires the ${name} suites to run`);
	console.warn(`Skipping ${name} suites: nothing answers at ${url} (set CI=true to make this an error)`);
	return false;
}

let postgres: Promise<boolean> | undefined;
let nats: Promise<boolean> | undefined;

export const postgresAvailable = () => (postgres ??= required("PostgreSQL", TEST_DATABASE_URL, 5432));
export const natsAvailable = () => (nats ??= required("NATS", TEST_NATS_URL, 4222));

export type DatabaseKind = "sqlite" | "postgres";

/**
 * The databases a suite should run against. Jest collects tests synchronously, so this reads a
 * value probed in the global setup (test/helpers/global-setup.ts) through the environment.
 */
export function testDatabases(): DatabaseKind[] {
	return process.env.TEST_POSTGRES === "yes" ? ["sqlite", "postgres"] : ["sqlite"];
}

export function natsEnabled(): boolean {
	return process.env.TEST_NATS === "yes";
}

/** What a suite needs beyond Node: the shared servers, or other programs. */
export interface SuiteNeeds {
	postgres?: boolean;
	nats?: boolean;
	/** Programs the suite runs, by name, each with whether it was found. */
	programs?: Record<string, boolean>;
}

/**
 * `describe` for a suite with needs, or `describe.skip` on a laptop that lacks one, saying which.
 * In CI nothing is skipped: the global setup has already failed the run if PostgreSQL or NATS is
 * missing, and a missing program fails the suite here.
 */
export function describeWhere(needs: SuiteNeeds): jest.Describe {
	const missing = [
		...(needs.postgres && process.env.TEST_POSTGRES !== "yes" ? ["PostgreSQL"] : []),
		...(needs.nats && !natsEnabled() ? ["NATS"] : []),
		...Object.entries(needs.programs ?? {})
			.filter(([, found]) => !found)
			.map(([name]) => name),
	];
	if (missing.length === 0) return describe;
	if (inCi) throw new Error(`a suite needs ${missing.join(" and ")}, and CI requires every suite to run`);
	console.warn(`Skipping a suite: it needs ${missing.join(" and ")} (set CI=true to make this an error)`);
	return describe.skip;
}
