// What the dispatcher prunes (RETENTION_PERIOD, scheduled by mixins/retention.mixin.ts): messages
// older than the period with their finished deliveries and those deliveries' attempts (deleted by
// the foreign key's cascade), rejected events, and stale failure streaks. A message keeps every
// delivery still pending (a parked one, say) and stays itself until they finish.
import type { Knex } from "knex";
import { oldestRowsJob, type PruneJob } from "../../lib/retention";

interface MessageCursor {
	at?: string;
	id?: string;
}

/** Walks old messages in (created_at, event_id) order, so a message held by pending work is passed over, not re-read. */
const finishedMessages: PruneJob = {
	name: "delivery_messages",
	async batch({ db, cutoff, batchSize }, state) {
		const cursor = state as MessageCursor;
		let query = db("delivery_messages").where("created_at", "<", cutoff);
		if (cursor.at !== undefined) {
			query = query.andWhere(after => after.where("created_at", ">", cursor.at!).orWhere(tie => tie.where("created_at", "=", cursor.at!).andWhere("event_id", ">", cursor.id!)));
		}
		const messages: Array<{ event_id: string; created_at: string }> = await query
			.orderBy([{ column: "created_at" }, { column: "event_id" }])
			.limit(batchSize)
			.select("event_id", "created_at");
		if (messages.length === 0) return { deleted: 0, done: true };
		const last = messages[messages.length - 1];
		Object.assign(cursor, { at: last.created_at, id: last.event_id });
		const eventIds = messages.map(message => message.event_id);
		let deleted = 0;
		await db.transaction(async (trx: Knex.Transaction) => {
			deleted += await trx("deliveries").whereIn("event_id", eventIds).whereNot("status", "pending").delete();
			deleted += await trx("delivery_messages")
				.whereIn("event_id", eventIds)
				.whereNotExists(trx("deliveries").select(trx.raw("1")).whereRaw("deliveries.event_id = delivery_messages.event_id"))
				.delete();
		});
		return { deleted, done: messages.length < batchSize };
	},
};

export const DISPATCHER_PRUNE_JOBS: PruneJob[] = [
	finishedMessages,
	oldestRowsJob("delivery_rejected_events", "delivery_rejected_events", "id", "received_at"),
	// A streak not extended for a whole period belongs to a webhook that is gone or long quiet.
	oldestRowsJob("webhook_failures", "webhook_failures", "webhook_id", "updated_at"),
];
