// Shape of GET /webhooks/{id}/stats: a webhook's delivery health per hour, counted by the
// database. Deliveries are bucketed by the hour they were created and counted by their current
// status; attempts are bucketed by the hour they were made and counted by outcome.
import { z } from "zod";
import { WebhookId } from "./webhooks";

export const STATS_WINDOWS = ["24h"] as const;

export const WebhookStatsParams = z
	.object({
		id: WebhookId,
		window: z.enum(STATS_WINDOWS, { message: `must be one of: ${STATS_WINDOWS.join(", ")}` }).default("24h"),
	})
	.strict();
export type WebhookStatsParams = z.infer<typeof WebhookStatsParams>;

const Count = z.number().int().min(0);

export const StatsBucket = z.object({
	start: z.string().describe("Start of the hour (ISO 8601 UTC)"),
	succeeded: Count.describe("Deliveries created in this hour that are now succeeded"),
	failed: Count.describe("… now failed (every retry used up)"),
	pending: Count.describe("… still pending (waiting for an attempt or a retry)"),
	cancelled: Count.describe("… cancelled (webhook deleted)"),
	attempts_succeeded: Count.describe("Attempts made in this hour that got a 200"),
	attempts_failed: Count.describe("Attempts made in this hour that failed"),
});
export type StatsBucket = z.infer<typeof StatsBucket>;

export const WebhookStats = z.object({
	webhook_id: z.string(),
	window: z.enum(STATS_WINDOWS),
	from: z.string().describe("Start of the first bucket"),
	to: z.string().describe("End of the last bucket (the end of the current hour)"),
	buckets: z.array(StatsBucket).describe("One per hour, oldest first, hours without deliveries included"),
	totals: StatsBucket.omit({ start: true }),
});
export type WebhookStats = z.infer<typeof WebhookStats>;
