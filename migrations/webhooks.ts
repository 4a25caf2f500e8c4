import type { Knex } from "knex";
import type { Migration } from "../mixins/db.mixin";
import { comparableName } from "../lib/schemas/common";
import { DEFAULT_ORDERING, MAX_WEBHOOK_NAME_LENGTH } from "../lib/schemas/webhooks";
import { moveImplicitCustomers, restoreImplicitCustomers } from "../lib/customers";

// Named so that the service can tell which rule a unique violation broke (PostgreSQL reports
// the constraint name; SQLite reports the columns).
export const UNIQUE_NAME_INDEX = "webhooks_customer_name_unique";
export const UNIQUE_URL_INDEX = "webhooks_customer_url_unique";

export /** Which uniqueness rule a database error broke, on either engine; undefined for other errors. */
function brokenUniqueRule(err: unknown): "name" | "url" | undefined {
	const failure = err as { code?: string; constraint?: string; message?: string };
	if (failure.code === "23505") {
		if (failure.constraint === UNIQUE_NAME_INDEX) return "name";
		if (failure.constraint === UNIQUE_URL_INDEX) return "url";
	}
	if (failure.code === "SQLITE_CONSTRAINT_UNIQUE") {
		if (/webhooks\.customer_id, webhooks\.name/.test(failure.message ?? "")) return "name";
		if (/webhooks\.customer_id, webhooks\.url/.test(failure.message ?? "")) return "url";
	}
	return undefined;
}

export const webhooksMigrations: Migration[] = [
	{
		name: "001_create_webhooks",
		async up(db) {
			await db.schema.createTable("webhooks", table => {
				table.string("id", 36).primary();
				table.string("customer_id", 200).notNullable();
				table.string("name", 100).notNullable();
				// Stored in normalised form (lib/url-policy.ts), which is ASCII and at most 2048 long.
				table.string("url", 2048).notNullable();
				// JSON array of topic names.
				table.text("events").notNullable();
				table.boolean("active").notNullable().defaultTo(true);
				// AES-256-GCM envelopes (lib/crypto.ts), with the webhook id as associated data.
				table.text("secret_envelope").notNullable();
				// The secret replaced by the last rotation keeps signing until this moment.
				table.text("previous_secret_envelope").nullable();
				table.string("previous_secret_expires_at", 30).nullable();
				table.string("created_at", 30).notNullable();
				table.string("updated_at", 30).notNullable();
				// The database enforces uniqueness, so two concurrent creates cannot both win.
				table.unique(["customer_id", "name"], { indexName: UNIQUE_NAME_INDEX });
				table.unique(["customer_id", "url"], { indexName: UNIQUE_URL_INDEX });
				// Keyset paging of one customer's webhooks.
				table.index(["customer_id", "created_at", "id"], "webhooks_customer_page");
			});
		},
		async down(db) {
			await db.schema.dropTable("webhooks");
		},
	},
	{
		// URLs are now stored without a trailing dot on the host ("https://example.com./" is
		// "https://example.com/"), so that the uniqueness rule sees one host. Rows stored before
		// are brought to that form, except where the customer already has the dot-less twin: two
		// webhooks must not be merged behind the customer's back, so that pair stays as it was.
		name: "002_url_host_without_trailing_dot",
		async up(db) {
			await normaliseTrailingDots(db);
		},
		async down() {
			// The dot-less form is a valid URL for the same host: nothing to undo.
		},
	},
	{
		// Why and when a webhook stopped: `user` (PATCH active=false), `gone` (its URL answered
		// 410) or `failing` (every attempt failed for WEBHOOK_DISABLE_AFTER). Null while active.
		name: "003_webhook_disabled_reason",
		async up(db) {
			await db.schema.alterTable("webhooks", table => {
				table.string("disabled_reason", 16).nullable();
				table.string("disabled_at", 30).nullable();
			});
			// Webhooks switched off before this column existed were switched off by a user.
			await db("webhooks").where({ active: false }).update({ disabled_reason: "user", disabled_at: db.ref("updated_at") });
		},
		async down(db) {
			await db.schema.alterTable("webhooks", table => {
				table.dropColumn("disabled_reason");
				table.dropColumn("disabled_at");
			});
		},
	},
	{
		// Custom request headers: names in clear (shown in the API), values sealed together in one
		// AES-256-GCM envelope with the webhook id as associated data, like the secrets.
		name: "004_webhook_custom_headers",
		async up(db) {
			await db.schema.alterTable("webhooks", table => {
				table.text("header_names").notNullable().defaultTo("[]");
				table.text("headers_envelope").nullable();
			});
		},
		async down(db) {
			await db.schema.alterTable("webhooks", table => {
				table.dropColumn("header_names");
				table.dropColumn("headers_envelope");
			});
		},
	},
	{
		// Users who are their own customer (no customer claim) now have the customer id "~<user id>",
		// apart from named customers (lib/customers.ts): their rows move to it.
		name: "005_implicit_customer_namespace",
		async up(db) {
			await moveImplicitCustomers(db, "webhooks");
		},
		async down(db) {
			await restoreImplicitCustomers(db, "webhooks");
		},
	},
	{
		// Names are now stored and compared in NFKC with spaces folded (comparableName), so that
		// look-alike spellings are one name. Stored names are brought to that form, except where
		// the customer already has a webhook with the resulting name: two webhooks are not merged
		// behind the customer's back, so that one keeps its name as it was.
		name: "006_webhook_names_nfkc",
		async up(db) {
			await normaliseNames(db);
		},
		async down() {
			// The comparable form is a valid name: nothing to undo.
		},
	},
	{
		// Ordering per order (API.md): `per_order` or `none`. Existing webhooks get the default, as a
		// new one does, so every webhook's order statuses arrive in order unless its customer opts out.
		name: "007_webhook_ordering",
		async up(db) {
			await db.schema.alterTable("webhooks", table => {
				table.string("ordering", 16).notNullable().defaultTo(DEFAULT_ORDERING);
			});
		},
		async down(db) {
			await db.schema.alterTable("webhooks", table => {
				table.dropColumn("ordering");
			});
		},
	},
	{
		// Rate limit per webhook (API.md `rate_limit`): deliveries per second, null for no limit.
		// Existing webhooks get null, as new ones do: nothing that was sent freely is held back.
		name: "008_webhook_rate_limit",
		async up(db) {
			await db.schema.alterTable("webhooks", table => {
				table.integer("rate_limit").nullable().defaultTo(null);
			});
		},
		async down(db) {
			await db.schema.alterTable("webhooks", table => {
				table.dropColumn("rate_limit");
			});
		},
	},
];

/** "https://example.com.:8443/x" → "https://example.com:8443/x"; undefined when already fine. */
export function withoutTrailingHostDot(url: string): string | undefined {
	try {
		const parsed = new URL(url);
		if (!parsed.hostname.endsWith(".") || parsed.hostname.startsWith("[")) return undefined;
		parsed.hostname = parsed.hostname.slice(0, -1);
		return parsed.href === url ? undefined : parsed.href;
	} catch {
		return undefined;
	}
}

async function normaliseTrailingDots(db: Knex): Promise<void> {
	// The stored form always has "/" or ":port" right after the host.
	const rows: Array<{ id: string; customer_id: string; url: string }> = await db("webhooks")
		.select("id", "customer_id", "url")
		.where("url", "like", "%./%")
		.orWhere("url", "like", "%.:%");
	for (const row of rows) {
		const url = withoutTrailingHostDot(row.url);
		if (!url) continue;
		const twin = await db("webhooks").where({ customer_id: row.customer_id, url }).first("id");
		if (!twin) await db("webhooks").where({ id: row.id }).update({ url });
	}
}

async function normaliseNames(db: Knex): Promise<void> {
	const rows: Array<{ id: string; customer_id: string; name: string }> = await db("webhooks").select("id", "customer_id", "name").orderBy(["customer_id", "created_at", "id"]);
	for (const row of rows) {
		const name = comparableName(row.name);
		if (name === row.name || name.length === 0 || name.length > MAX_WEBHOOK_NAME_LENGTH) continue;
		const twin = await db("webhooks").where({ customer_id: row.customer_id, name }).first("id");
		if (!twin) await db("webhooks").where({ id: row.id }).update({ name });
	}
}
