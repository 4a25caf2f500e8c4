// @satellite-webhooks/sdk: a typed client for the /id/v3 API and verifyWebhook for receivers.
export { SatelliteWebhooksClient, PageIterator, type ClientOptions, type DeliveryListOptions, type Page, type PageOptions } from "./client";
export { verifyWebhook, type HeaderSource, type VerifyOptions } from "./verify";
export { EVENT_DATA_SCHEMAS } from "./event-schemas";
export * from "./errors";
export type * from "./api-types";
