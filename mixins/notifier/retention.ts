// What the notifier prunes (RETENTION_PERIOD, scheduled by mixins/retention.mixin.ts): sent,
// failed and skipped emails and rejected events. Pending emails stay, however old.
import { oldestRowsJob, type PruneJob } from "../../lib/retention";

export const NOTIFIER_PRUNE_JOBS: PruneJob[] = [
	oldestRowsJob("email_outbox", "email_outbox", "id", "created_at", finished => finished.whereIn("status", ["sent", "failed", "skipped"])),
	oldestRowsJob("email_rejected_events", "email_rejected_events", "id", "received_at"),
];
