import type { Migration } from "../mixins/db.mixin";
import { IMPLICIT_CUSTOMER_PREFIX, MAX_IMPLICIT_USER_ID_LENGTH, restoreImplicitCustomers } from "../lib/customers";

export const usersMigrations: Migration[] = [
	{
		name: "001_create_users",
		async up(db) {
			// Filled from verified token claims (users.touch); the token's sub is the key.
			await db.schema.createTable("users", table => {
				table.string("user_id", 200).primary();
				table.string("customer_id", 200).notNullable();
				table.string("name", 200).nullable();
				table.string("email", 320).nullable();
				table.string("last_login", 30).nullable();
				table.string("created_at", 30).notNullable();
				table.string("updated_at", 30).notNullable();
			});
			// One row per (user, topic), so concurrent updates of different topics touch different
			// rows and cannot overwrite each other. No row means email is off, the default.
			await db.schema.createTable("user_email_preferences", table => {
				table.string("user_id", 200).notNullable().references("user_id").inTable("users").onDelete("CASCADE");
				table.string("topic", 100).notNullable();
				table.boolean("email").notNullable();
				table.string("updated_at", 30).notNullable();
				table.primary(["user_id", "topic"]);
				// users.emailRecipients looks users up by topic.
				table.index(["topic", "email"], "user_email_preferences_topic_email");
			});
		},
		async down(db) {
			await db.schema.dropTable("user_email_preferences");
			await db.schema.dropTable("users");
		},
	},
	{
		// Users who are their own customer (no customer claim) now have the customer id "~<user id>",
		// apart from named customers (lib/customers.ts). The next request with a token refreshes
		// the record anyway; the other services' migrations read it to move their own rows.
		name: "002_implicit_customer_namespace",
		async up(db) {
			await db("users")
				.whereRaw("customer_id = user_id")
				.whereRaw("length(user_id) <= ?", [MAX_IMPLICIT_USER_ID_LENGTH])
				.update({ customer_id: db.raw("? || user_id", [IMPLICIT_CUSTOMER_PREFIX]) });
		},
		async down(db) {
			await restoreImplicitCustomers(db, "users");
		},
	},
];
