// Customer ids. A token names its customer in the customer claim; a token without one is a user
// who is their own customer (an implicit customer). Both kinds used to share one namespace, so a
// token with sub "c2" and no claim acted as the named customer "c2". An implicit customer's id is
// now the user id behind a "~", a character no customer claim may contain, so the two never meet.
import type { Knex } from "knex";

export const IMPLICIT_CUSTOMER_PREFIX = "~";

/** What a customer claim (and a user id) may hold: 1..200 of these characters, no "~". */
export const EXTERNAL_ID_PATTERN = /^[\w.@|:+-]{1,200}$/;

/** A customer id as stored: a named customer's id, or "~" and the id of a user (1..199 characters). */
export const CUSTOMER_ID_PATTERN = /^(?:[\w.@|:+-]{1,200}|~[\w.@|:+-]{1,199})$/;

/** Longest user id that can be its own customer: the stored id, "~" included, fits 200 characters. */
export const MAX_IMPLICIT_USER_ID_LENGTH = 199;

export function implicitCustomerId(userId: string): string {
	return `${IMPLICIT_CUSTOMER_PREFIX}${userId}`;
}

/**
 * For a data migration: moves the rows of `table` whose customer_id was an implicit customer's
 * (the id of a user who was their own customer) to that customer's "~" id.
 *
 * Only the users table can tell which ids were implicit: a user whose record names themselves as
 * customer, in the old or the new form. So this migration reads it, although the users service
 * owns it: it is a one-off step of the data's history, and every service shares the database. An
 * id that a user was their own customer under and that another user's token also named as
 * customer was reachable by both; it stays with the named customer, the tenant proper. Without a
 * users table (a fresh database) there is nothing to move.
 */
export async function moveImplicitCustomers(db: Knex | Knex.Transaction, table: string): Promise<void> {
	if (!(await db.schema.hasTable("users"))) return;
	await db(table)
		.whereIn("customer_id", implicitCustomerUserIds(db))
		.update({ customer_id: db.raw("? || customer_id", [IMPLICIT_CUSTOMER_PREFIX]) });
}

function implicitCustomerUserIds(db: Knex | Knex.Transaction): Knex.QueryBuilder {
	return db("users as own")
		.select("own.user_id")
		.whereRaw("length(own.user_id) <= ?", [MAX_IMPLICIT_USER_ID_LENGTH])
		.where(builder => builder.whereRaw("own.customer_id = own.user_id").orWhereRaw("own.customer_id = ? || own.user_id", [IMPLICIT_CUSTOMER_PREFIX]))
		.whereNotExists(db("users as named").select(db.raw("1")).whereRaw("named.customer_id = own.user_id").whereRaw("named.user_id <> own.user_id"));
}

/** Undoes moveImplicitCustomers: "~alice" becomes "alice" again (the shared namespace). */
export async function restoreImplicitCustomers(db: Knex | Knex.Transaction, table: string): Promise<void> {
	await db(table)
		.where("customer_id", "like", `${IMPLICIT_CUSTOMER_PREFIX}%`)
		.update({ customer_id: db.raw("substr(customer_id, 2)") });
}
