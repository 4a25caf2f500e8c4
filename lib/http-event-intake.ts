// What the HTTP intake (POST /id/v3/events/tasking.order_status) accepts, as pure functions: the
// body is one event or a list of at most MAX_EVENTS_PER_REQUEST, every event is checked with the
// same schema the consumers use, and every problem names its place (`[3].status` in a list,
// `status` for a single event). mixins/gateway-event-intake.ts applies them.
import { formatIssuePath, issuesToProblems } from "./zod-problems";
import type { FieldProblem } from "./errors";
import { MAX_EVENTS_PER_REQUEST, TaskingOrderStatusEvent } from "./schemas/events";

export interface IncomingEvent {
	/** The event as sent, with its event_id: what the consumers get, as from the channel. */
	payload: Record<string, unknown>;
	/** The checked event (for the customer lookup). */
	event: TaskingOrderStatusEvent;
	/** Where it was in the body: "" for a single event, "[3]" in a list. */
	at: string;
}

export type ParsedBody = { events: IncomingEvent[]; problems: [] } | { events: []; problems: FieldProblem[] };

const isPlainObject = (value: unknown): value is Record<string, unknown> => typeof value === "object" && value !== null && !Array.isArray(value);

/** `field` under `at`: "[3]" + "user_id" -> "[3].user_id"; "" + "user_id" -> "user_id". */
export function fieldPath(at: string, field: string): string {
	return at && field ? `${at}.${field}` : at || field;
}

/**
 * Checks the whole body; events are returned only when every one is valid. An event without
 * event_id gets one from `newId`; ids are lower-cased, as the consumers key them.
 */
export function parseEventsBody(body: unknown, newId: () => string): ParsedBody {
	const list = Array.isArray(body);
	const items: unknown[] = list ? body : [body];
	if (list && items.length === 0) return { events: [], problems: [{ path: "", message: "must hold at least one event" }] };
	if (items.length > MAX_EVENTS_PER_REQUEST) {
		return { events: [], problems: [{ path: "", message: `holds ${items.length} events: send at most ${MAX_EVENTS_PER_REQUEST} per request` }] };
	}
	const events: IncomingEvent[] = [];
	const problems: FieldProblem[] = [];
	items.forEach((item, index) => {
		const at = list ? formatIssuePath([index]) : "";
		if (!isPlainObject(item)) {
			problems.push({ path: at, message: "must be an event object" });
			return;
		}
		const parsed = TaskingOrderStatusEvent.safeParse(item);
		if (!parsed.success) {
			for (const problem of issuesToProblems(parsed.error)) problems.push({ path: fieldPath(at, problem.path), message: problem.message });
			return;
		}
		const eventId = (parsed.data.event_id ?? newId()).toLowerCase();
		events.push({ payload: { ...item, event_id: eventId }, event: { ...parsed.data, event_id: eventId }, at });
	});
	return problems.length ? { events: [], problems } : { events, problems: [] };
}
