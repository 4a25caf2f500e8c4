// How a consuming service (dispatcher, notifier) takes `tasking.order_status` in, in one place:
//   - from the durable channel (cluster mode): acknowledged only once the service has persisted
//     the event; a database outage means a delayed redelivery, never a loss;
//   - as a plain broker event (both modes): best effort, with a few quick retries, because an
//     emitted event has nobody to redeliver it.
// The service supplies `ingestOrderStatus`, which persists the event (or records it as rejected)
// and throws only when a dependency failed, so that trying again later can succeed.
import type { Context, ServiceBroker, ServiceSchema } from "moleculer";
import { retryOnDependencyFailure } from "../lib/dependency-retry";
import { isDependencyFailure } from "../lib/errors";
import { deadLetter, INTAKE_MAX_DELIVERIES, intakeChannelSettings, ORDER_STATUS_CHANNEL, redeliveryDelayMs, stableEventId, type IntakeGroup } from "../lib/intake-channel";
import type { AppConfig } from "../lib/config";
import { TASKING_ORDER_STATUS_EVENT, withEventId } from "../lib/schemas/events";

export type IntakeSource = "channel" | "event";

export interface OrderStatusIntakeThis {
	broker: ServiceBroker;
	config: AppConfig;
	stopping: boolean;
	logger: { error(...args: unknown[]): void; warn(...args: unknown[]): void };
	ingestOrderStatus(payload: unknown, source: IntakeSource, ctx?: Context): Promise<void>;
	receiveOrderStatus(payload: unknown, message: JetStreamMessage): Promise<void>;
}

/** The part of a JetStream message (nats.js JsMsg) the intake uses. */
export interface JetStreamMessage {
	info: { stream: string; streamSequence: number; timestampNanos: number; redeliveryCount: number };
	nak(delayMs?: number): void;
}

// A broker event is retried this many times in-process before it is given up (and logged).
const EVENT_RETRIES = 3;
const EVENT_RETRY_MS = 200;

export function OrderStatusIntakeMixin(group: IntakeGroup): Partial<ServiceSchema> {
	return {
		// Read by @moleculer/channels where the node runs it (cluster mode); ignored otherwise.
		channels: {
			[ORDER_STATUS_CHANNEL]: {
				...intakeChannelSettings(group),
				async handler(this: OrderStatusIntakeThis, payload: unknown, message: JetStreamMessage) {
					await this.receiveOrderStatus(payload, message);
				},
			},
		},

		events: {
			[TASKING_ORDER_STATUS_EVENT]: {
				// One copy per consuming service, shared by its instances.
				group,
				async handler(this: OrderStatusIntakeThis, ctx: Context<unknown>) {
					try {
						await retryOnDependencyFailure(() => this.ingestOrderStatus(ctx.params, "event", ctx), {
							attempts: EVENT_RETRIES,
							delayMs: EVENT_RETRY_MS,
							stopping: () => this.stopping,
						});
					} catch (err) {
						this.logger.error(`A ${TASKING_ORDER_STATUS_EVENT} event could not be persisted and is lost (send it to the channel to have it redelivered)`, err);
					}
				},
			},
		},

		methods: {
			/**
			 * Returning acknowledges the message. A failure asks JetStream for a later redelivery,
			 * backing off; at the bound the event moves to the dead-letter stream (with its event_id,
			 * so that a replay is still recognised as a repeat), and only once it is stored there
			 * is the message acknowledged.
			 */
			async receiveOrderStatus(this: OrderStatusIntakeThis, payload: unknown, message: JetStreamMessage): Promise<void> {
				// Without an event_id, the id its stored message implies: the same in every group.
				const event = withEventId(payload, () => stableEventId(message.info));
				try {
					await this.ingestOrderStatus(event, "channel");
				} catch (err) {
					const deliveries = message.info.redeliveryCount;
					if (deliveries >= INTAKE_MAX_DELIVERIES) {
						try {
							await deadLetter(this.broker, this.config.NAMESPACE, group, event);
							this.logger.error(`A ${TASKING_ORDER_STATUS_EVENT} event failed ${deliveries} times; moved it to the dead-letter stream (npm run replay-dead-letters)`, err);
							return;
						} catch (moveErr) {
							this.logger.error(`A ${TASKING_ORDER_STATUS_EVENT} event failed ${deliveries} times and could not be dead-lettered; it stays in the stream`, moveErr);
						}
					}
					const delay = redeliveryDelayMs(deliveries);
					const reason = isDependencyFailure(err) ? "a dependency is unavailable" : "an unexpected error";
					this.logger.warn(`Could not persist a ${TASKING_ORDER_STATUS_EVENT} event (${reason}); JetStream redelivers it in ${delay} ms`, isDependencyFailure(err) ? (err as Error).message : err);
					message.nak(delay);
				}
			},
		},
	};
}
