// The notifier's tables: the email outbox and the events it rejected.
import type { Migration } from "../mixins/db.mixin";
import { moveImplicitCustomers, restoreImplicitCustomers } from "../lib/customers";

export const notifierMigrations: Migration[] = [
	{
		name: "001_create_email_outbox",
		async up(db) {
			await db.schema.createTable("email_outbox", table => {
				table.string("id", 36).primary();
				// The event_id, or a digest of the event when it came without one: with user_id it
				// makes a repeated event a no-op.
				table.string("event_key", 100).notNullable();
				table.string("event_id", 36).nullable();
				table.string("user_id", 200).notNullable();
				table.string("customer_id", 200).nullable();
				table.string("order_id", 200).notNullable();
				table.string("order_status", 50).notNullable();
				// JSON snapshot of the order fields the email shows, so every attempt renders the same.
				table.text("order_snapshot").notNullable();
				// Fixed at intake, so a resend after a crash carries the same Message-ID.
				table.string("message_id", 200).notNullable();
				// pending -> sent | failed | skipped (the owner had email off or no address).
				table.string("status", 20).notNullable();
				table.string("recipient", 320).nullable();
				table.integer("attempts").notNullable().defaultTo(0);
				table.string("first_attempt_at", 30).nullable();
				table.string("next_attempt_at", 30).notNullable();
				table.string("lease_owner", 100).nullable();
				table.string("lease_until", 30).nullable();
				table.string("last_error", 1000).nullable();
				table.string("smtp_response", 500).nullable();
				table.string("created_at", 30).notNullable();
				table.string("updated_at", 30).notNullable();
				table.string("sent_at", 30).nullable();
				table.unique(["event_key", "user_id"], { indexName: "email_outbox_event_user_unique" });
				table.index(["status", "next_attempt_at"], "email_outbox_due_index");
				// The operators' view lists newest first.
				table.index(["created_at"], "email_outbox_created_index");
			});
			await db.schema.createTable("email_rejected_events", table => {
				table.string("id", 36).primary();
				table.string("received_at", 30).notNullable();
				// JSON list of {path, message}.
				table.text("errors").notNullable();
				// The payload as received, cut to a bounded size.
				table.text("payload").notNullable();
				table.index(["received_at"], "email_rejected_events_received_index");
			});
		},
		async down(db) {
			await db.schema.dropTable("email_rejected_events");
			await db.schema.dropTable("email_outbox");
		},
	},
	{
		// Users who are their own customer (no customer claim) now have the customer id "~<user id>",
		// apart from named customers (lib/customers.ts): their rows move to it.
		name: "002_implicit_customer_namespace",
		async up(db) {
			await moveImplicitCustomers(db, "email_outbox");
		},
		async down(db) {
			await restoreImplicitCustomers(db, "email_outbox");
		},
	},
	{
		// The W3C traceparent of the event's trace (lib/tracing.ts): the email's span joins it.
		name: "003_trace_context",
		async up(db) {
			await db.schema.alterTable("email_outbox", table => {
				table.text("trace_context").nullable();
			});
		},
		async down(db) {
			await db.schema.alterTable("email_outbox", table => {
				table.dropColumn("trace_context");
			});
		},
	},
];
