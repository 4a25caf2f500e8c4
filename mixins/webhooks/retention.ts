// What the webhooks service prunes on the retention schedule (mixins/retention.mixin.ts).
import type { PruneJob } from "../../lib/retention";

/** A rotation's previous secret is erased once its grace period is over, not kept until the next rotation. */
export const EXPIRED_PREVIOUS_SECRETS: PruneJob = {
	name: "webhooks_previous_secret",
	async batch({ db, now, batchSize }) {
		const expired = db("webhooks").select("id").where("previous_secret_expires_at", "<=", now).limit(batchSize);
		const cleared = await db("webhooks").whereIn("id", expired).update({ previous_secret_envelope: null, previous_secret_expires_at: null });
		return { deleted: cleared, done: cleared < batchSize };
	},
};
