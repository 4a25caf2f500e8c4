// The webhooks service's shared vocabulary: the `webhooks` row and what of it is public, the
// caller's meta, and `WebhooksThis`, the one type of `this` that services/webhooks.service.ts and
// every mixin in this folder share.
import type { Context, ServiceSchema, ServiceSettingSchema } from "moleculer";
import type { DbServiceThis } from "../db.mixin";
import type { AllowList } from "../../lib/address-ranges";
import type { SqliteReadCache } from "../../lib/sqlite-read-cache";
import type { counter } from "../../lib/metrics";
import type { FieldProblem } from "../../lib/errors";
import type { TenantMeta } from "../../lib/gateway-meta";
import type { DisabledReason, Subscriber, WebhookOrdering, WebhookView } from "../../lib/schemas/webhooks";

// What a listing reads: everything `present` needs and nothing secret.
export const PUBLIC_COLUMNS = ["id", "name", "url", "events", "active", "disabled_reason", "disabled_at", "header_names", "ordering", "rate_limit", "created_at", "updated_at"] as const;
export type PublicWebhookRow = Pick<WebhookRow, (typeof PUBLIC_COLUMNS)[number]>;

export interface WebhookRow {
	id: string;
	customer_id: string;
	name: string;
	url: string;
	events: string;
	active: boolean | number;
	disabled_reason: DisabledReason | null;
	disabled_at: string | null;
	/** JSON array of the custom header names; the values are in headers_envelope, encrypted. */
	header_names: string;
	headers_envelope: string | null;
	ordering: WebhookOrdering;
	/** Deliveries per second at most; null for no limit. */
	rate_limit: number | null;
	secret_envelope: string;
	previous_secret_envelope: string | null;
	previous_secret_expires_at: string | null;
	created_at: string;
	updated_at: string;
}

export type { TenantMeta };

export type WebhooksThis = DbServiceThis & {
	allowList: AllowList;
	secretsKey: string;
	disables: ReturnType<typeof counter>;
	/** Embedded SQLite only: pages kept while the database is unchanged (lib/sqlite-read-cache.ts). */
	listCache?: SqliteReadCache;
	// services/webhooks.service.ts
	announceDisabled(ctx: Context, customerId: string, view: WebhookView): void;
	tenantOf(ctx: Context<unknown, TenantMeta>): string;
	findOwned(customerId: string, id: string): Promise<WebhookRow>;
	unknownTopicProblems(ctx: Context, topics: string[], path: string): Promise<FieldProblem[]>;
	present(row: PublicWebhookRow): WebhookView;
	asConflict(err: unknown): unknown;
	// secrets.mixin.ts
	seal(secret: string, id: string): string;
	/** The signing secrets in clear, newest first, and when the previous one stops signing. */
	signingOf(row: WebhookRow): Pick<Subscriber, "secrets" | "previousSecretExpiresAt">;
};

/** A part of the webhooks service: its actions and methods, all run with `this` the service. */
export type WebhooksMixin = Partial<ServiceSchema<ServiceSettingSchema, WebhooksThis>>;
