import type { Migration } from "../mixins/db.mixin";

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
		// Why and when a webhook stopped: `user` (PATCH active=false), `gone` (its URL answered
		// 410) or `failing` (every attempt failed for WEBHOOK_DISABLE_AFTER). Null while active.
		name: "002_webhook_disabled_reason",
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
		name: "003_webhook_custom_headers",
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
];
