import type { Migration } from "../mixins/db.mixin";

export const topicsMigrations: Migration[] = [
	{
		name: "001_create_topics",
		async up(db) {
			await db.schema.createTable("topics", table => {
				table.string("topic", 100).primary();
				table.string("category", 50).notNullable();
				table.string("name", 200).notNullable();
				table.string("description", 1000).notNullable();
				// Whether users may opt in to email for this topic (user settings list these).
				table.boolean("email_capable").notNullable().defaultTo(false);
				// Whether webhooks may subscribe to it (GET /webhooks/events lists these).
				table.boolean("webhook_capable").notNullable().defaultTo(true);
				table.string("created_at", 30).notNullable();
				table.string("updated_at", 30).notNullable();
			});
		},
		async down(db) {
			await db.schema.dropTable("topics");
		},
	},
	{
		name: "002_topic_data_schema",
		async up(db) {
			// JSON Schema (as JSON text) of the `data` of the topic's deliveries; null: not described.
			await db.schema.alterTable("topics", table => {
				table.text("data_schema").nullable();
			});
		},
		async down(db) {
			await db.schema.alterTable("topics", table => {
				table.dropColumn("data_schema");
			});
		},
	},
];
