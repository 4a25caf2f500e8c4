// The `data` of each delivered message type, as receivers see it. The topic catalogue publishes
// these as JSON Schema (GET /webhooks/events, `schema`), and the SDK validates deliveries with the
// same schemas, so that the zod schema the dispatcher builds bodies from is the only description.
import { z } from "zod";
import { OrderStatusMessage, WebhookTestMessage } from "./deliveries";
import { WebhookDisabledMessage } from "./webhooks";
import { openForAdditions, type JsonSchema } from "../openapi/json-schema";

/** Message types whose `data` the service describes: the catalogue's own topics and the test send. */
export const EVENT_DATA = {
	"tasking:order_status": OrderStatusMessage.shape.data,
	"webhook:disabled": WebhookDisabledMessage.shape.data,
	"webhook:test": WebhookTestMessage.shape.data,
} as const;
export type DescribedEventType = keyof typeof EVENT_DATA;

/** The schema of a topic registered without one: any `data` at all. */
export const UNDESCRIBED_DATA: JsonSchema = {
	$schema: "https://json-schema.org/draft/2020-12/schema",
	description: "Not described by the service that registered this topic",
};

/**
 * JSON Schema (draft 2020-12) of one type's `data`, as the service sends it. Open for additions:
 * a field added later must not make a receiver that validates refuse the delivery.
 */
export function eventDataJsonSchema(type: DescribedEventType): JsonSchema {
	return openForAdditions(z.toJSONSchema(EVENT_DATA[type], { io: "output", target: "draft-2020-12" })) as JsonSchema;
}
