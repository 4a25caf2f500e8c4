// Dispatcher rejected events: intake (intake.mixin.ts) records an order status event that can
// never be valid (it fails validation, or names an unknown user and no customer) in
// `delivery_rejected_events`, with the reason and an excerpt of the payload, before it throws
// the client error (a 422 to `publish`; a channel or broker event is acknowledged, and this
// record is what is left of it).
import { nowIso } from "../db.mixin";
import { isDependencyFailure } from "../../lib/errors";
import { TASKING_ORDER_STATUS_EVENT } from "../../lib/schemas/events";
import { REJECTED_EXCERPT_CHARS, type DispatcherMixin, type DispatcherThis, type EventSource } from "./shared";

/** PostgreSQL text cannot hold NUL characters, and a rejected payload may contain anything. */
const storable = (text: string, max: number) => text.replaceAll("\u0000", "").slice(0, max);

function excerptOf(payload: unknown): string {
	let text: string;
	try {
		text = JSON.stringify(payload) ?? String(payload);
	} catch {
		text = String(payload);
	}
	return text.length > REJECTED_EXCERPT_CHARS ? `${storable(text, REJECTED_EXCERPT_CHARS)}…` : storable(text, REJECTED_EXCERPT_CHARS);
}

export const RejectedEventsMixin: DispatcherMixin = {
	methods: {
		async recordRejection(this: DispatcherThis, source: EventSource, payload: unknown, reason: string): Promise<void> {
			const eventId = payload && typeof payload === "object" ? (payload as { event_id?: unknown }).event_id : undefined;
			this.logger.warn(`Rejected a ${TASKING_ORDER_STATUS_EVENT} event (${source}): ${reason}`);
			try {
				await this.db("delivery_rejected_events").insert({
					source,
					event_id: typeof eventId === "string" ? storable(eventId, 100) : null,
					reason: storable(reason, 1000),
					excerpt: excerptOf(payload),
					received_at: nowIso(),
				});
			} catch (err) {
				// Unrecorded, the rejection would vanish: let the channel redeliver, or the caller retry.
				if (isDependencyFailure(err)) throw err;
				this.logger.error("Could not record a rejected event", err);
			}
		},
	},
};
