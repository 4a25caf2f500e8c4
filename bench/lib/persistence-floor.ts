// The persistence floor: the least CPU that keeping a delivery in PostgreSQL costs, whatever the
// service around it. The raw loop (the floor in delivery.ts) sends without writing anything; a
// service that persists each delivery before its attempt and records its result writes at least
// this: per event its body once, per delivery a row keyed by a time-ordered id (no index but the
// primary keys), and after the attempt one update of that row, each write a prepared statement
// over a whole batch, as the dispatcher's hot writes are (lib/pg-statements.ts). Its client and
// PostgreSQL's CPU per delivery, added to the raw loop's, say how much of the goal's 1.5 × the
// raw loop the guarantee alone takes, and how much is left for everything else.
import knex, { type Knex } from "knex";
import { timeOrderedUuid } from "../../lib/ids";
import { columnArrays, runPrepared, unnestColumns, type PreparedStatement } from "../../lib/pg-statements";
import { databaseCounters, databaseWorkBetween, type DatabaseWork } from "./database-work";
import { cpuSecondsBetween, cpuSecondsByPid, DATABASE_PROCESSES } from "./process-cpu";
import { floorBody } from "./signed-post";
import { round } from "./stats";

// A batch as the dispatcher's intake writes them under load: a few events of ten deliveries each.
const EVENTS_PER_BATCH = 6;
const WEBHOOKS = 10;
const WARM_UP_BATCHES = 100;

export interface PersistenceFloor {
	deliveries: number;
	deliveries_per_batch: number;
	/** CPU per delivery: this process's pg client, every PostgreSQL process, and both. */
	cpu_us_per_delivery: { client: number; database: number; total: number };
	/** As the backlog's bursts report theirs. */
	postgresql_per_delivery: DatabaseWork;
}

interface EventRow {
	event_id: string;
	body: string;
}
interface DeliveryRow {
	id: string;
	event_id: string;
	webhook_id: string;
}

const EVENT_COLUMNS = [["event_id", "text"], ["body", "text"]] as const;
const DELIVERY_COLUMNS = [["id", "text"], ["event_id", "text"], ["webhook_id", "text"]] as const;

const INSERT: PreparedStatement = {
	name: "persistence_floor_insert",
	text: `WITH events AS (
			INSERT INTO floor_messages (event_id, body) SELECT * FROM ${unnestColumns(EVENT_COLUMNS, 1, "e")}
		)
		INSERT INTO floor_deliveries (id, event_id, webhook_id, status)
		SELECT d.id, d.event_id, d.webhook_id, 'pending' FROM ${unnestColumns(DELIVERY_COLUMNS, 3, "d")}`,
};
const RECORD_RESULTS: PreparedStatement = {
	name: "persistence_floor_results",
	text: `UPDATE floor_deliveries SET status = 'delivered', status_code = 200, attempted_at = $2
		FROM unnest($1::text[]) AS r(id) WHERE floor_deliveries.id = r.id`,
};

function batchOf(webhookIds: string[]): { events: EventRow[]; deliveries: DeliveryRow[] } {
	const events = Array.from({ length: EVENTS_PER_BATCH }, (_, i) => ({ event_id: timeOrderedUuid(), body: floorBody(i) }));
	const deliveries = events.flatMap(event => webhookIds.map(webhook_id => ({ id: timeOrderedUuid(), event_id: event.event_id, webhook_id })));
	return { events, deliveries };
}

async function persist(db: Knex, webhookIds: string[]): Promise<void> {
	const { events, deliveries } = batchOf(webhookIds);
	await runPrepared(db, INSERT, [
		...columnArrays(events, [e => e.event_id, e => e.body]),
		...columnArrays(deliveries, [d => d.id, d => d.event_id, d => d.webhook_id]),
	]);
	await runPrepared(db, RECORD_RESULTS, [deliveries.map(d => d.id), new Date().toISOString()]);
}

/** Measures the persistence floor over `deliveries` deliveries, in a schema of its own that it removes after. */
export async function persistenceFloor(databaseUrl: string, schema: string, deliveries: number): Promise<PersistenceFloor> {
	const admin = knex({ client: "pg", connection: databaseUrl, pool: { min: 0, max: 1 } });
	const db = knex({ client: "pg", connection: databaseUrl, searchPath: [schema], pool: { min: 1, max: 1 } });
	const webhookIds = Array.from({ length: WEBHOOKS }, () => timeOrderedUuid());
	const batches = Math.ceil(deliveries / (EVENTS_PER_BATCH * WEBHOOKS));
	let created = false;
	try {
		// Fails on a schema that exists: what is not this run's own is never dropped below.
		await admin.raw(`CREATE SCHEMA "${schema}"`);
		created = true;
		await db.raw('CREATE TABLE floor_messages (event_id text COLLATE "C" PRIMARY KEY, body text NOT NULL)');
		await db.raw(`CREATE TABLE floor_deliveries (id text COLLATE "C" PRIMARY KEY, event_id text NOT NULL, webhook_id text NOT NULL,
			status text NOT NULL, status_code integer, attempted_at text)`);
		for (let i = 0; i < WARM_UP_BATCHES; i++) await persist(db, webhookIds);
		const countersBefore = await databaseCounters(db);
		const databaseBefore = cpuSecondsByPid(DATABASE_PROCESSES);
		const clientBefore = process.cpuUsage();
		for (let i = 0; i < batches; i++) await persist(db, webhookIds);
		const client = process.cpuUsage(clientBefore);
		const databaseSeconds = cpuSecondsBetween(databaseBefore, cpuSecondsByPid(DATABASE_PROCESSES));
		const measured = batches * EVENTS_PER_BATCH * WEBHOOKS;
		const work = await databaseWorkBetween(db, countersBefore, measured);
		const counted = (await db.raw("SELECT count(*)::int AS rows, count(*) FILTER (WHERE status = 'delivered')::int AS delivered FROM floor_deliveries")).rows[0];
		const written = (WARM_UP_BATCHES + batches) * EVENTS_PER_BATCH * WEBHOOKS;
		if (counted.rows !== written || counted.delivered !== written) throw new Error(`persistence floor: ${counted.delivered} of ${counted.rows} rows delivered, ${written} written`);
		const clientUs = (client.user + client.system) / measured;
		const databaseUs = (databaseSeconds * 1e6) / measured;
		return {
			deliveries: measured,
			deliveries_per_batch: EVENTS_PER_BATCH * WEBHOOKS,
			cpu_us_per_delivery: { client: round(clientUs), database: round(databaseUs), total: round(clientUs + databaseUs) },
			postgresql_per_delivery: work,
		};
	} finally {
		await db.destroy();
		try {
			if (created) await admin.raw(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
		} finally {
			await admin.destroy();
		}
	}
}
