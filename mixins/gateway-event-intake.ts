// The HTTP intake of the gateway: POST /id/v3/events/tasking.order_status, for producers outside
// the broker (API.md, "Over HTTP, for producers outside the broker"). It answers 202 only once
// every event of the request is stored durably, and then each event takes the same path as one
// sent to the channel: deliveries and emails, a repeated event_id recognised and skipped.
//
//   cluster   each event goes to the durable channel (`sendToChannel` resolves once JetStream has
//             stored it), where the dispatcher's and the notifier's consumer groups take it.
//   embedded  each event goes through `dispatcher.publish`, the acknowledged intake: it answers
//             once the deliveries are committed and the notifier has the event in its outbox.
//
// A list is all or nothing as far as the request can make it so: every event is checked, and
// every customer looked up, before the first one is stored; a bad event stores nothing (422).
// Stores themselves cannot be one transaction across JetStream messages, so a failure part-way
// answers 503 saying so, and repeating the request is safe by event_id.
import type { Context, ServiceBroker, ServiceSchema } from "moleculer";
import { z } from "zod";
import { zodParams } from "./validation";
import { EVENTS_PUBLISH_SCOPE, hasScope, type Principal } from "../lib/auth";
import { ClientProblem, isDependencyFailure, UnavailableProblem, UnprocessableError, type FieldProblem } from "../lib/errors";
import { fieldPath, parseEventsBody, type IncomingEvent } from "../lib/http-event-intake";
import { timeOrderedUuid } from "../lib/ids";
import { ORDER_STATUS_CHANNEL } from "../lib/intake-channel";
import { answersWithin, natsClientsOf, type NatsClient } from "../lib/nats-clients";
import type { PublishedEvents } from "../lib/schemas/events";

/** The action behind the route; the gateway answers it with 202. */
export const PUBLISH_EVENTS_ACTION = "api.publishOrderStatus";

/** The action's params: the route hands over the JSON body as it came, one event or a list. */
export const PUBLISH_EVENTS_BODY_PARAM = "body";

// A JetStream connection that does not answer a PING within this long is taken as down.
const INTAKE_PING_TIMEOUT_MS = 2_000;

const NOTHING_STORED = "The event intake (NATS JetStream) is unreachable. Nothing was stored; send the request again shortly.";

type IntakeThis = {
	broker: ServiceBroker;
	logger: { error(...args: unknown[]): void };
	resolveCustomers(ctx: Context, events: IncomingEvent[]): Promise<FieldProblem[]>;
	storeEvents(ctx: Context, events: IncomingEvent[]): Promise<void>;
	intakeAnswers(): Promise<boolean>;
};

type ChannelBroker = ServiceBroker & { sendToChannel?: (channel: string, payload: unknown) => Promise<void> };

interface IntakeAdapter {
	connected?: boolean;
	stopping?: boolean;
	connection?: NatsClient | null;
}

/** 403 for a token without the scope; the gateway also checks it before reading the body. */
export function requirePublishScope(principal: Principal | undefined): void {
	if (!hasScope(principal, EVENTS_PUBLISH_SCOPE)) {
		throw new ClientProblem(403, "forbidden", `Posting events needs a token with the scope ${EVENTS_PUBLISH_SCOPE}; this token does not carry it`);
	}
}

export const GatewayEventIntake: Partial<ServiceSchema> = {
	actions: {
		publishOrderStatus: {
			visibility: "published",
			params: zodParams(z.object({ [PUBLISH_EVENTS_BODY_PARAM]: z.unknown() }).strict()),
			async handler(this: IntakeThis, ctx: Context<Record<string, unknown>, { principal?: Principal }>): Promise<PublishedEvents> {
				requirePublishScope(ctx.meta.principal);
				const body = ctx.params[PUBLISH_EVENTS_BODY_PARAM];
				if (body === undefined) throw new UnprocessableError("The request failed validation", [{ path: "", message: "send one event object, or a list of events, as the JSON body" }]);
				const parsed = parseEventsBody(body, timeOrderedUuid);
				const problems = parsed.problems.length ? parsed.problems : await this.resolveCustomers(ctx, parsed.events);
				if (problems.length) throw new UnprocessableError("The request failed validation: nothing was stored", problems);
				await this.storeEvents(ctx, parsed.events);
				return { event_ids: parsed.events.map(({ event }) => event.event_id!) };
			},
		},
	},

	methods: {
		/**
		 * Events without customer_id are for the customer of their user, as the consumers would look
		 * it up; looked up here, so that an unknown user is a 422 rather than a rejection the
		 * producer never sees. The customer found is written into the event.
		 */
		async resolveCustomers(this: IntakeThis, ctx: Context, events: IncomingEvent[]): Promise<FieldProblem[]> {
			const users = [...new Set(events.filter(({ event }) => !event.customer_id).map(({ event }) => event.user_id))];
			const customers = new Map<string, string | null>();
			await Promise.all(
				users.map(async userId => {
					try {
						const user: { customer_id: string } = await ctx.call("users.get", { userId });
						customers.set(userId, user.customer_id);
					} catch (err) {
						// A 404 from Moleculer itself (users not running) is a dependency failure: 503.
						if ((err as { code?: number }).code !== 404 || isDependencyFailure(err)) throw err;
						customers.set(userId, null);
					}
				}),
			);
			const problems: FieldProblem[] = [];
			for (const { event, payload, at } of events) {
				if (event.customer_id) continue;
				const customerId = customers.get(event.user_id);
				if (customerId) payload.customer_id = customerId;
				else problems.push({ path: fieldPath(at, "user_id"), message: "is not a known user, and no customer_id was given" });
			}
			return problems;
		},

		/** Resolves once every event is stored durably; see the header for what each mode means. */
		async storeEvents(this: IntakeThis, ctx: Context, events: IncomingEvent[]): Promise<void> {
			const broker = this.broker as ChannelBroker;
			if (!broker.sendToChannel) {
				const outcomes = await Promise.allSettled(events.map(({ payload }) => ctx.call("dispatcher.publish", payload)));
				const failure = outcomes.find(outcome => outcome.status === "rejected");
				if (failure) throw failure.reason;
				return;
			}
			if (!(await this.intakeAnswers())) throw new UnavailableProblem(NOTHING_STORED);
			const outcomes = await Promise.allSettled(events.map(({ payload }) => broker.sendToChannel!(ORDER_STATUS_CHANNEL, payload)));
			const failed = outcomes.filter(outcome => outcome.status === "rejected");
			if (failed.length === 0) return;
			this.logger.error(`The event intake did not confirm ${failed.length} of ${events.length} events`, failed[0].reason);
			throw new UnavailableProblem(
				`The event intake (NATS JetStream) failed part-way: ${events.length - failed.length} of ${events.length} events were confirmed stored, and the others may or may not be. ` +
					"Send the same request again: an event_id already stored is recognised and delivered once. Events sent without an event_id get a new one each time, so give every event its own.",
			);
		},

		/**
		 * Whether the channel's JetStream connection answers now. The client keeps reconnecting
		 * while NATS is down, and would queue a publish until it is back, after our answer: a
		 * request that finds it down is refused before anything is sent.
		 */
		async intakeAnswers(this: IntakeThis): Promise<boolean> {
			const adapter = natsClientsOf(this.broker).intake as IntakeAdapter | undefined;
			const connection = adapter?.connection;
			if (!adapter?.connected || adapter.stopping || !connection) return false;
			return answersWithin(connection, INTAKE_PING_TIMEOUT_MS);
		},
	},
};
