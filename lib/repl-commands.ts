// Operator commands for the Moleculer REPL (`npm run repl`), registered as `replCommands` in the
// broker options. They reach the services only through broker calls, so they work the same in
// the embedded process and from a REPL node that joined a cluster and runs no service. Each
// validates its arguments before calling anything, prints a table, and never prints a secret
// (webhook secrets are never asked for; tokens are not stored anywhere they could be read).
import crypto from "node:crypto";
import type { ServiceBroker } from "moleculer";
import { z } from "zod";
import { parseDuration } from "./durations";
import { ORDER_STATUSES, CustomerId, TASKING_ORDER_STATUS_EVENT, TaskingOrderStatusEvent } from "./schemas/events";
import { TopicRegistration, type CatalogueTopic } from "./schemas/topics";
import { DELIVERY_STATUSES, type Delivery } from "./schemas/deliveries";
import type { WebhookPage, WebhookView } from "./schemas/webhooks";

interface CommandArgs {
	options: Record<string, unknown>;
	[name: string]: unknown;
}

interface ReplHelpers {
	table: (rows: unknown[][], config?: Record<string, unknown>) => string;
	getBorderCharacters: (name: string) => Record<string, string>;
}

export interface ReplCommand {
	command: string;
	description: string;
	options?: Array<{ option: string; description: string }>;
	action(broker: ServiceBroker, args: CommandArgs, helpers: ReplHelpers): Promise<void>;
}

/** An argument the operator got wrong: printed as is, nothing is called. */
class UsageError extends Error {}

const OUTBOX_STATUSES = ["pending", "sent", "failed", "skipped"] as const;
const MAX_LISTED = 500;
// Services on other nodes may take a moment to be discovered after the REPL node joins.
const DISCOVERY_WAIT_MS = 5_000;

const uuid = z.uuid();

function requireUuid(value: unknown, what: string): string {
	const parsed = uuid.safeParse(value);
	if (!parsed.success) throw new UsageError(`${what} must be a UUID, got ${JSON.stringify(value ?? "")}`);
	return parsed.data.toLowerCase();
}

function requireCustomerId(value: unknown, what: string): string {
	const parsed = CustomerId.safeParse(value);
	if (!parsed.success) throw new UsageError(`${what} ${parsed.error.issues[0].message}, got ${JSON.stringify(value ?? "")}`);
	return parsed.data;
}

function oneOf<T extends string>(value: unknown, allowed: readonly T[], what: string): T | undefined {
	if (value === undefined) return undefined;
	if (typeof value !== "string" || !allowed.includes(value as T)) throw new UsageError(`${what} must be one of: ${allowed.join(", ")}`);
	return value as T;
}

/** An ISO 8601 time, or a duration meaning "that long ago" (30m, 2h, 7d). */
function parseSince(value: unknown): string | undefined {
	if (value === undefined) return undefined;
	if (typeof value !== "string" || value === "") throw new UsageError("--since needs a time: an ISO 8601 timestamp or a duration ago, e.g. 2h");
	try {
		return new Date(Date.now() - parseDuration(value)).toISOString();
	} catch {
		// not a duration: try a timestamp
	}
	const at = Date.parse(value);
	if (!/^\d{4}-\d\d-\d\d/.test(value) || Number.isNaN(at)) throw new UsageError(`--since must be an ISO 8601 timestamp or a duration ago (e.g. 2h), got ${JSON.stringify(value)}`);
	return new Date(at).toISOString();
}

function positiveInt(value: unknown, what: string, max: number): number | undefined {
	if (value === undefined) return undefined;
	const number = Number(value);
	if (!Number.isInteger(number) || number < 1 || number > max) throw new UsageError(`${what} must be a whole number from 1 to ${max}`);
	return number;
}

const cell = (value: unknown): string => {
	if (value === null || value === undefined || value === "") return "-";
	if (Array.isArray(value)) return value.join(", ");
	return String(value);
};

function printTable(helpers: ReplHelpers, header: string[], rows: unknown[][], empty: string): void {
	if (rows.length === 0) {
		console.log(empty);
		return;
	}
	console.log(helpers.table([header, ...rows.map(row => row.map(cell))], { border: helpers.getBorderCharacters("ramac"), drawHorizontalLine: (index: number, size: number) => index <= 1 || index === size }));
}

/** Describes a failed call in one line, with the fields a validation error names. */
function describeError(err: unknown): string {
	const failure = err as { message?: string; name?: string; data?: unknown; code?: unknown };
	if (failure.name === "ServiceNotFoundError" || failure.name === "ServiceNotAvailableError") {
		return `${failure.message} (is that service running? In a cluster, check TRANSPORTER and NAMESPACE)`;
	}
	const fields = Array.isArray(failure.data) ? (failure.data as Array<{ path?: string; message?: string }>).filter(item => item && typeof item.message === "string") : [];
	const detail = fields.length ? `: ${fields.map(item => `${item.path || "(body)"} ${item.message}`).join("; ")}` : "";
	return `${failure.message ?? String(err)}${detail}`;
}

async function call<T>(broker: ServiceBroker, action: string, params: object = {}, meta: object = {}): Promise<T> {
	const service = action.split(".")[0];
	await broker.waitForServices(service, DISCOVERY_WAIT_MS).catch(() => undefined);
	return broker.call<T, object>(action, params, { meta });
}

/** The customer owning a webhook, asked of the webhooks service (no secret travels). */
async function ownerOf(broker: ServiceBroker, webhookId: string): Promise<string> {
	const { customerId } = await call<{ customerId: string }>(broker, "webhooks.owner", { id: webhookId });
	return customerId;
}

function tokenOf(page: { links: Array<{ href: string }> }): string | undefined {
	const next = page.links[0]?.href;
	return next ? (new URL(next, "http://repl.invalid").searchParams.get("token") ?? undefined) : undefined;
}

function command(definition: ReplCommand): ReplCommand {
	return {
		...definition,
		async action(broker, args, helpers) {
			try {
				await definition.action(broker, args, helpers);
			} catch (err) {
				console.log(err instanceof UsageError ? `error: ${err.message}` : `error: ${describeError(err)}`);
			}
		},
	};
}

/** The deliveries table's last column: when the next attempt comes, or, with ordering per order, which earlier delivery of the order it waits for. */
export function nextAttemptCell(delivery: Pick<Delivery, "next_attempt_at" | "waiting_for">): string | null {
	return delivery.waiting_for ? `waiting for ${delivery.waiting_for}` : delivery.next_attempt_at;
}

export function replCommands(): ReplCommand[] {
	return [
		command({
			command: "webhooks <customer>",
			description: "A customer's webhooks, with the status of each one's latest delivery",
			async action(broker, args, helpers) {
				const customerId = requireCustomerId(args.customer, "customer");
				const webhooks: WebhookView[] = [];
				let token: string | undefined;
				do {
					const page: WebhookPage = await call(broker, "webhooks.list", { per_page: 100, ...(token ? { token } : {}) }, { customerId });
					webhooks.push(...page.webhooks);
					token = tokenOf(page);
				} while (token && webhooks.length < MAX_LISTED);
				const rows = [];
				for (const webhook of webhooks) {
					const latest = await call<{ deliveries: Delivery[] }>(broker, "dispatcher.listDeliveries", { id: webhook.id, per_page: 1 }, { customerId }).then(
						page => page.deliveries[0],
						() => undefined,
					);
					const lastDelivery = latest ? `${latest.status}${latest.last_status_code ? ` (${latest.last_status_code})` : latest.last_error_kind ? ` (${latest.last_error_kind})` : ""}` : "none";
					// Why and since when (`user`, `gone` for a 410, `failing` after WEBHOOK_DISABLE_AFTER).
					const disabled = webhook.active || !webhook.disabled_reason ? "" : `${webhook.disabled_reason} since ${webhook.disabled_at}`;
					const rateLimit = webhook.rate_limit === null ? "none" : `${webhook.rate_limit}/s`;
					rows.push([webhook.id, webhook.name, webhook.url, webhook.events, webhook.active ? "yes" : "no", disabled, webhook.ordering, rateLimit, lastDelivery, latest?.last_attempt_at]);
				}
				printTable(helpers, ["id", "name", "url", "events", "active", "disabled", "ordering", "rate limit", "latest delivery", "last attempt"], rows, `No webhooks for customer ${customerId}.`);
			},
		}),
		command({
			command: "deliveries <webhookId>",
			description: "A webhook's recent deliveries, newest first; a waiting one names the earlier delivery of its order it waits for",
			options: [
				{ option: "--status <status>", description: `only ${DELIVERY_STATUSES.join(", ")}` },
				{ option: "--since <time>", description: "created at or after: ISO 8601, or a duration ago (2h)" },
				{ option: "--limit <n>", description: "at most this many (default 20)" },
			],
			async action(broker, args, helpers) {
				const webhookId = requireUuid(args.webhookId, "webhook id");
				const status = oneOf(args.options.status, DELIVERY_STATUSES, "--status");
				const since = parseSince(args.options.since);
				const limit = positiveInt(args.options.limit, "--limit", MAX_LISTED) ?? 20;
				const customerId = await ownerOf(broker, webhookId);
				const deliveries: Delivery[] = [];
				let token: string | undefined;
				let older = false;
				do {
					const page: { deliveries: Delivery[]; links: Array<{ href: string }> } = await call(
						broker,
						"dispatcher.listDeliveries",
						{ id: webhookId, per_page: 100, ...(status ? { status } : {}), ...(token ? { token } : {}) },
						{ customerId },
					);
					for (const delivery of page.deliveries) {
						if (since && delivery.created_at < since) older = true;
						else if (deliveries.length < limit) deliveries.push(delivery);
					}
					token = tokenOf(page);
				} while (token && !older && deliveries.length < limit);
				printTable(
					helpers,
					["id", "created", "status", "attempts", "last code", "last error", "next attempt"],
					deliveries.map(d => [d.id, d.created_at, d.status, d.attempt_count, d.last_status_code, d.last_error_kind, nextAttemptCell(d)]),
					"No deliveries match.",
				);
			},
		}),
		command({
			command: "retry <deliveryId>",
			description: "Schedule a fresh attempt of one delivery now",
			async action(broker, args, helpers) {
				const deliveryId = requireUuid(args.deliveryId, "delivery id");
				const located = await call<{ webhook_id: string; customer_id: string }>(broker, "dispatcher.locateDelivery", { delivery_id: deliveryId });
				const delivery = await call<Delivery>(broker, "dispatcher.retryDelivery", { id: located.webhook_id, delivery_id: deliveryId }, { customerId: located.customer_id });
				printTable(helpers, ["delivery", "webhook", "status", "next attempt"], [[delivery.id, delivery.webhook_id, delivery.status, delivery.next_attempt_at]], "");
				console.log("Scheduled 1 attempt.");
			},
		}),
		command({
			command: "retry-failed <webhookId>",
			description: "Schedule a fresh attempt now of every failed delivery of a webhook since a time",
			options: [{ option: "--since <time>", description: "required: failed at or after, ISO 8601 or a duration ago (24h)" }],
			async action(broker, args, helpers) {
				const webhookId = requireUuid(args.webhookId, "webhook id");
				const since = parseSince(args.options.since);
				if (!since) throw new UsageError("retry-failed needs --since <time>, e.g. --since 24h or --since 2026-11-20T00:00:00Z");
				const customerId = await ownerOf(broker, webhookId);
				const ids = await call<string[]>(broker, "dispatcher.failedDeliveriesSince", { webhook_id: webhookId, since });
				const rows = [];
				for (const id of ids) {
					const delivery = await call<Delivery>(broker, "dispatcher.retryDelivery", { id: webhookId, delivery_id: id }, { customerId });
					rows.push([delivery.id, delivery.status, delivery.next_attempt_at]);
				}
				printTable(helpers, ["delivery", "status", "next attempt"], rows, "");
				console.log(`Scheduled ${ids.length} attempt(s).`);
			},
		}),
		...(["disable", "enable"] as const).map(verb =>
			command({
				command: `${verb} <webhookId>`,
				description: verb === "disable" ? "Pause a webhook: deliveries are parked, not attempted" : "Resume a webhook and its parked deliveries",
				async action(broker, args, helpers) {
					const webhookId = requireUuid(args.webhookId, "webhook id");
					const customerId = await ownerOf(broker, webhookId);
					const webhook = await call<WebhookView>(broker, "webhooks.update", { id: webhookId, active: verb === "enable" }, { customerId });
					printTable(helpers, ["id", "name", "customer", "active"], [[webhook.id, webhook.name, customerId, webhook.active ? "yes" : "no"]], "");
				},
			}),
		),
		command({
			command: "send-test-event <customer> <user> <status>",
			description: `Send a ${TASKING_ORDER_STATUS_EVENT} event through the producers' intake (status: ${ORDER_STATUSES.join(", ")})`,
			async action(broker, args, helpers) {
				const parsed = TaskingOrderStatusEvent.safeParse({
					event_id: crypto.randomUUID(),
					customer_id: args.customer,
					user_id: args.user,
					order_id: `repl-test-${crypto.randomBytes(4).toString("hex")}`,
					status: args.status,
					order_name: "Test order from the REPL",
				});
				if (!parsed.success) throw new UsageError(parsed.error.issues.map(issue => `${issue.path.join(".")} ${issue.message}`).join("; "));
				const event = parsed.data;
				// The durable channel where the cluster brokers have one (@moleculer/channels), the event otherwise.
				const channels = broker as unknown as { sendToChannel?: (name: string, payload: unknown) => Promise<unknown> };
				let via: string;
				if (typeof channels.sendToChannel === "function") {
					await channels.sendToChannel(TASKING_ORDER_STATUS_EVENT, event);
					via = "channel";
				} else {
					await broker.emit(TASKING_ORDER_STATUS_EVENT, event);
					via = "event";
				}
				printTable(helpers, ["event id", "customer", "user", "order", "status", "sent as"], [[event.event_id, event.customer_id, event.user_id, event.order_id, event.status, via]], "");
			},
		}),
		command({
			command: "outbox",
			description: "The email outbox, newest first",
			options: [
				{ option: "--status <status>", description: `only ${OUTBOX_STATUSES.join(", ")}` },
				{ option: "--limit <n>", description: "at most this many (default 20)" },
			],
			async action(broker, args, helpers) {
				const status = oneOf(args.options.status, OUTBOX_STATUSES, "--status");
				const limit = positiveInt(args.options.limit, "--limit", MAX_LISTED) ?? 20;
				const entries = await call<
					Array<{ id: string; created_at: string; status: string; recipient: string | null; order_id: string; order_status: string; attempts: number; next_attempt_at: string | null; last_error: string | null }>
				>(broker, "notifier.outbox", { limit, ...(status ? { status } : {}) });
				printTable(
					helpers,
					["id", "created", "status", "recipient", "order", "order status", "attempts", "next attempt", "last error"],
					entries.map(e => [e.id, e.created_at, e.status, e.recipient, e.order_id, e.order_status, e.attempts, e.next_attempt_at, e.last_error?.slice(0, 80)]),
					"The outbox holds no such email.",
				);
			},
		}),
		command({
			command: "topics",
			description: "The event-topic catalogue",
			async action(broker, _args, helpers) {
				const topics = await call<CatalogueTopic[]>(broker, "topics.list");
				printTable(helpers, ["topic", "category", "name", "email", "webhooks", "description"], topics.map(t => [t.topic, t.category, t.name, t.email ? "yes" : "no", t.webhooks ? "yes" : "no", t.description]), "No topics.");
			},
		}),
		command({
			command: "register-topic <topic> <name> <description>",
			description: "Add (or update) a topic, e.g. register-topic imagery:ready \"Imagery ready\" \"When imagery can be downloaded\"",
			options: [
				{ option: "--email", description: "users may turn on email for it" },
				{ option: "--no-webhooks", description: "webhooks may not subscribe to it" },
			],
			async action(broker, args, helpers) {
				const topic = typeof args.topic === "string" ? args.topic : "";
				const parsed = TopicRegistration.safeParse({
					topic,
					category: topic.split(":")[0],
					name: args.name,
					description: args.description,
					email: args.options.email === true,
					webhooks: args.options.webhooks !== false,
				});
				if (!parsed.success) throw new UsageError(parsed.error.issues.map(issue => `${issue.path.join(".") || "topic"} ${issue.message}`).join("; "));
				const catalogue = await call<CatalogueTopic[]>(broker, "topics.register", parsed.data);
				const registered = catalogue.find(entry => entry.topic === parsed.data.topic)!;
				printTable(helpers, ["topic", "category", "name", "email", "webhooks"], [[registered.topic, registered.category, registered.name, registered.email ? "yes" : "no", registered.webhooks ? "yes" : "no"]], "");
			},
		}),
		command({
			command: "backlog",
			description: "Pending deliveries and emails, and how long the oldest has waited",
			async action(broker, _args, helpers) {
				// Each half answers on its own: a cluster may run no notifier, or no dispatcher, for a while.
				const [deliveries, emails] = await Promise.allSettled([
					call<{ pending: number; due: number; oldest_due_at: string | null; oldest_due_age_seconds: number }>(broker, "dispatcher.backlog"),
					call<{ by_status: Record<string, number>; oldest_pending_at: string | null; oldest_pending_age_seconds: number }>(broker, "notifier.backlog"),
				]);
				const unavailable = (result: PromiseRejectedResult) => `unavailable: ${describeError(result.reason)}`;
				printTable(
					helpers,
					["queue", "pending", "due now", "oldest waiting since", "oldest age (s)"],
					[
						deliveries.status === "fulfilled"
							? ["deliveries", deliveries.value.pending, deliveries.value.due, deliveries.value.oldest_due_at, deliveries.value.oldest_due_age_seconds.toFixed(1)]
							: ["deliveries", unavailable(deliveries), "", "", ""],
						emails.status === "fulfilled"
							? ["emails", emails.value.by_status.pending ?? 0, "-", emails.value.oldest_pending_at, emails.value.oldest_pending_age_seconds.toFixed(1)]
							: ["emails", unavailable(emails), "", "", ""],
					],
					"",
				);
				if (emails.status === "fulfilled") {
					console.log(`Emails by status: ${Object.entries(emails.value.by_status).map(([status, count]) => `${status} ${count}`).join(", ")}`);
				}
			},
		}),
	];
}
