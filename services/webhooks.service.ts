// webhooks: owns the customers' webhooks (table `webhooks`): their URLs, event topics, status
// and signing secrets, which are encrypted at rest and rotated with a grace period, and custom
// request headers, whose values are encrypted the same way and never shown again (only names). Serves the
// /webhooks management routes, and gives the dispatcher the signing secrets in clear through
// `subscribers` and `resolve`, which the gateway does not expose. A webhook is disabled by its
// user (PATCH active=false) or by the dispatcher (`disable`: its URL answered 410 Gone, or every
// attempt failed for WEBHOOK_DISABLE_AFTER); the reason and time are kept until it is re-enabled.
import crypto from "node:crypto";
import type { Context, ServiceSchema, ServiceSettingSchema } from "moleculer";
import { DbMixin, nowIso, type DbServiceThis } from "../mixins/db.mixin";
import { zodParams } from "../mixins/validation";
import { webhooksMigrations, brokenUniqueRule } from "../migrations/webhooks";
import { ClientProblem, ConflictError, NotFoundError, UnprocessableError, type FieldProblem } from "../lib/errors";
import { decryptSecret, encryptSecret, generateWebhookSecret } from "../lib/crypto";
import { openHeaders, sealHeaders } from "../lib/webhook-headers";
import { RetentionMixin } from "../mixins/retention.mixin";
import { EXPIRED_PREVIOUS_SECRETS } from "../mixins/webhooks/retention";
import { parseAllowList, type AllowList } from "../lib/address-ranges";
import { buildPage, decodeCursor } from "../lib/pagination";
import { checkWebhookUrl } from "../lib/url-policy";
import { counter } from "../lib/metrics";
import type { CatalogueTopic } from "../lib/schemas/topics";
import {
	CreateWebhook,
	DisableParams,
	ListWebhooks,
	ResolveParams,
	SubscribersParams,
	UpdateWebhook,
	WEBHOOK_EVENTS,
	WebhookIdParams,
	type DisableResult,
	type DisabledReason,
	type ResolvedWebhook,
	type Subscriber,
	type WebhookChangedEvent,
	type WebhookDisabledEvent,
	type WebhookPage,
	type WebhookRemovedEvent,
	type WebhookRotatedEvent,
	type WebhookView,
	type WebhookWithSecret,
} from "../lib/schemas/webhooks";

const LIST_PATH = "/id/v3/webhooks";
// What a listing reads: everything `present` needs and nothing secret.
const PUBLIC_COLUMNS = ["id", "name", "url", "events", "active", "disabled_reason", "disabled_at", "header_names", "created_at", "updated_at"] as const;
type PublicWebhookRow = Pick<WebhookRow, (typeof PUBLIC_COLUMNS)[number]>;
const WEBHOOK_TOPICS_PATH = "/id/v3/webhooks/events";
// Two rotations racing on one webhook: the loser re-reads and retries, so that no secret that
// was handed to a client is silently dropped.
const ROTATE_ATTEMPTS = 5;

interface WebhookRow {
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
	secret_envelope: string;
	previous_secret_envelope: string | null;
	previous_secret_expires_at: string | null;
	created_at: string;
	updated_at: string;
}

/** The part of the call's meta this service reads: the gateway puts the caller's customer there. */
interface TenantMeta {
	customerId?: string;
}

type WebhooksThis = DbServiceThis & {
	allowList: AllowList;
	secretsKey: string;
	disables: ReturnType<typeof counter>;
	announceDisabled(ctx: Context, customerId: string, view: WebhookView): void;
	tenantOf(ctx: Context<unknown, TenantMeta>): string;
	findOwned(customerId: string, id: string): Promise<WebhookRow>;
	unknownTopicProblems(ctx: Context, topics: string[], path: string): Promise<FieldProblem[]>;
	present(row: PublicWebhookRow): WebhookView;
	seal(secret: string, id: string): string;
	secretsOf(row: WebhookRow): string[];
	asConflict(err: unknown): unknown;
};

function rejectIfAny(problems: FieldProblem[]): void {
	if (problems.length === 0) return;
	throw new UnprocessableError(problems.map(problem => `${problem.path}: ${problem.message}`).join("; "), problems);
}

const WebhooksService: ServiceSchema<ServiceSettingSchema, WebhooksThis> = {
	name: "webhooks",
	mixins: [DbMixin("webhooks", webhooksMigrations) as Partial<ServiceSchema>, RetentionMixin([EXPIRED_PREVIOUS_SECRETS]) as Partial<ServiceSchema>],

	actions: {
		/** POST /webhooks: the only answer, with rotate, that carries the secret. */
		create: {
			params: zodParams(CreateWebhook),
			async handler(this: WebhooksThis, ctx: Context<CreateWebhook, TenantMeta>): Promise<WebhookWithSecret> {
				const customerId = this.tenantOf(ctx);
				const { name, events } = ctx.params;
				const urlCheck = checkWebhookUrl(ctx.params.url, this.allowList);
				rejectIfAny([
					...urlCheck.problems.map(message => ({ path: "url", message })),
					...(await this.unknownTopicProblems(ctx, events, "events")),
				]);

				const id = crypto.randomUUID();
				const secret = generateWebhookSecret();
				const now = nowIso();
				const row: WebhookRow = {
					id,
					customer_id: customerId,
					name,
					url: urlCheck.url,
					events: JSON.stringify(events),
					active: true,
					disabled_reason: null,
					disabled_at: null,
					...sealHeaders(ctx.params.headers ?? {}, this.secretsKey, id),
					secret_envelope: this.seal(secret, id),
					previous_secret_envelope: null,
					previous_secret_expires_at: null,
					created_at: now,
					updated_at: now,
				};
				try {
					await this.db("webhooks").insert(row);
				} catch (err) {
					throw this.asConflict(err);
				}
				this.logger.info(`Webhook ${id} created for customer ${customerId}`);
				// Broadcast, not emit: every dispatcher instance caches webhooks and must hear of changes.
				ctx.broadcast<WebhookChangedEvent>(WEBHOOK_EVENTS.created, { id, customerId, active: true });
				return { ...this.present(row), secret };
			},
		},

		/** GET /webhooks: the caller's webhooks, oldest first, keyset-paged. */
		list: {
			params: zodParams(ListWebhooks),
			async handler(this: WebhooksThis, ctx: Context<ListWebhooks, TenantMeta>): Promise<WebhookPage> {
				const customerId = this.tenantOf(ctx);
				const { per_page: perPage, token } = ctx.params;
				const cursor = decodeCursor(token);
				let query = this.db("webhooks")
					.select([...PUBLIC_COLUMNS])
					.where({ customer_id: customerId })
					.orderBy([{ column: "created_at" }, { column: "id" }])
					.limit(perPage + 1);
				if (cursor) {
					query = query.andWhere(after =>
						after.where("created_at", ">", cursor.at).orWhere(tie => tie.where("created_at", "=", cursor.at).andWhere("id", ">", cursor.id)),
					);
				}
				const rows: PublicWebhookRow[] = await query;
				// A first page that holds everything already tells how many match.
				const matched =
					!cursor && rows.length <= perPage
						? rows.length
						: Number((await this.db("webhooks").where({ customer_id: customerId }).count({ count: "*" }))[0].count);
				const page = buildPage(
					rows,
					perPage,
					matched,
					row => ({ at: row.created_at, id: row.id }),
					row => this.present(row),
					next => `${LIST_PATH}?per_page=${perPage}&token=${encodeURIComponent(next)}`,
				);
				return { webhooks: page.items, context: page.context, links: page.links };
			},
		},

		/** GET /webhooks/{id} */
		get: {
			params: zodParams(WebhookIdParams),
			async handler(this: WebhooksThis, ctx: Context<WebhookIdParams, TenantMeta>): Promise<WebhookView> {
				return this.present(await this.findOwned(this.tenantOf(ctx), ctx.params.id));
			},
		},

		/** PATCH /webhooks/{id}: name, events and active may change; the URL may not. */
		update: {
			params: zodParams(UpdateWebhook),
			async handler(this: WebhooksThis, ctx: Context<UpdateWebhook, TenantMeta>): Promise<WebhookView> {
				const customerId = this.tenantOf(ctx);
				const { id, name, events, active, headers } = ctx.params;
				const row = await this.findOwned(customerId, id);
				if (events) rejectIfAny(await this.unknownTopicProblems(ctx, events, "events"));

				const changes: Partial<WebhookRow> = { updated_at: nowIso() };
				if (name !== undefined) changes.name = name;
				if (events !== undefined) changes.events = JSON.stringify(events);
				if (headers !== undefined) Object.assign(changes, sealHeaders(headers, this.secretsKey, id));
				if (active === true) Object.assign(changes, { active, disabled_reason: null, disabled_at: null });
				// Switching off a webhook the dispatcher already disabled keeps the dispatcher's reason.
				if (active === false && row.active) Object.assign(changes, { active, disabled_reason: "user", disabled_at: changes.updated_at });
				let updated: number;
				try {
					updated = await this.db("webhooks").where({ id, customer_id: customerId }).update(changes);
				} catch (err) {
					throw this.asConflict(err);
				}
				if (updated === 0) throw new NotFoundError("Webhook");
				const view = this.present({ ...row, ...changes });
				ctx.broadcast<WebhookChangedEvent>(WEBHOOK_EVENTS.updated, { id, customerId, active: view.active });
				if (changes.disabled_reason === "user") this.announceDisabled(ctx, customerId, view);
				return view;
			},
		},

		/** DELETE /webhooks/{id}: the dispatcher cancels its pending deliveries on `webhooks.removed`. */
		remove: {
			params: zodParams(WebhookIdParams),
			async handler(this: WebhooksThis, ctx: Context<WebhookIdParams, TenantMeta>): Promise<void> {
				const customerId = this.tenantOf(ctx);
				const { id } = ctx.params;
				const removed = await this.db("webhooks").where({ id, customer_id: customerId }).delete();
				if (removed === 0) throw new NotFoundError("Webhook");
				this.logger.info(`Webhook ${id} of customer ${customerId} removed`);
				ctx.broadcast<WebhookRemovedEvent>(WEBHOOK_EVENTS.removed, { id, customerId });
			},
		},

		/**
		 * POST /webhooks/{id}/rotate: a new secret, shown once. The replaced one keeps signing
		 * (as a second signature) for SECRET_ROTATION_GRACE, so receivers can switch without a gap.
		 * A second rotation within the grace period drops the oldest secret.
		 */
		rotate: {
			params: zodParams(WebhookIdParams),
			async handler(this: WebhooksThis, ctx: Context<WebhookIdParams, TenantMeta>): Promise<WebhookWithSecret> {
				const customerId = this.tenantOf(ctx);
				const { id } = ctx.params;
				const secret = generateWebhookSecret();
				const grace = this.config.SECRET_ROTATION_GRACE;
				for (let attempt = 0; attempt < ROTATE_ATTEMPTS; attempt += 1) {
					const row = await this.findOwned(customerId, id);
					const now = new Date();
					const changes: Partial<WebhookRow> = {
						secret_envelope: this.seal(secret, id),
						previous_secret_envelope: grace > 0 ? row.secret_envelope : null,
						previous_secret_expires_at: grace > 0 ? new Date(now.getTime() + grace).toISOString() : null,
						updated_at: now.toISOString(),
					};
					// Only if nobody rotated since we read the row: otherwise their secret would vanish.
					const updated = await this.db("webhooks").where({ id, customer_id: customerId, secret_envelope: row.secret_envelope }).update(changes);
					if (updated === 1) {
						this.logger.info(`Webhook ${id} of customer ${customerId}: secret rotated`);
						ctx.broadcast<WebhookRotatedEvent>(WEBHOOK_EVENTS.rotated, { id, customerId });
						return { ...this.present({ ...row, ...changes }), secret };
					}
				}
				throw new ConflictError("The webhook's secret is being rotated by another request; try again");
			},
		},

		/** The active webhooks of a customer subscribed to a topic, with their signing secrets. */
		subscribers: {
			visibility: "public",
			params: zodParams(SubscribersParams),
			async handler(this: WebhooksThis, ctx: Context<SubscribersParams>): Promise<Subscriber[]> {
				const { customerId, topic } = ctx.params;
				const rows: WebhookRow[] = await this.db("webhooks").where({ customer_id: customerId, active: true }).orderBy("created_at");
				return rows
					.filter(row => (JSON.parse(row.events) as string[]).includes(topic))
					.map(row => ({ id: row.id, customerId: row.customer_id, url: row.url, secrets: this.secretsOf(row), headers: openHeaders(row, this.secretsKey) }));
			},
		},

		/** The webhooks among `ids` that still exist, active or not; deleted ones are absent. */
		resolve: {
			visibility: "public",
			params: zodParams(ResolveParams),
			async handler(this: WebhooksThis, ctx: Context<ResolveParams>): Promise<ResolvedWebhook[]> {
				const ids = [...new Set(ctx.params.ids)];
				if (ids.length === 0) return [];
				const rows: WebhookRow[] = await this.db("webhooks").whereIn("id", ids);
				return rows.map(row => ({
					id: row.id,
					customerId: row.customer_id,
					url: row.url,
					active: Boolean(row.active),
					secrets: this.secretsOf(row),
					headers: openHeaders(row, this.secretsKey),
				}));
			},
		},

		/** Which customer a webhook belongs to, for operators' tools (the REPL); no secret. 404 if unknown. */
		owner: {
			visibility: "public",
			params: zodParams(WebhookIdParams),
			async handler(this: WebhooksThis, ctx: Context<WebhookIdParams>): Promise<{ id: string; customerId: string }> {
				const row: Pick<WebhookRow, "id" | "customer_id"> | undefined = await this.db("webhooks").select("id", "customer_id").where({ id: ctx.params.id }).first();
				if (!row) throw new NotFoundError("Webhook");
				return { id: row.id, customerId: row.customer_id };
			},
		},

		/**
		 * The dispatcher disables a webhook its receiver told to go away (410) or that kept failing.
		 * Only an active webhook changes, so a repeat (or a race of two dispatchers) announces once.
		 */
		disable: {
			visibility: "public",
			params: zodParams(DisableParams),
			async handler(this: WebhooksThis, ctx: Context<DisableParams>): Promise<DisableResult> {
				const { id, reason } = ctx.params;
				const now = nowIso();
				const changed = await this.db("webhooks").where({ id, active: true }).update({ active: false, disabled_reason: reason, disabled_at: now, updated_at: now });
				const row: (PublicWebhookRow & { customer_id: string }) | undefined = await this.db("webhooks").where({ id }).first([...PUBLIC_COLUMNS, "customer_id"]);
				if (!row) return { disabled: false, webhook: null };
				const view = this.present(row);
				if (changed === 1) {
					ctx.broadcast<WebhookChangedEvent>(WEBHOOK_EVENTS.updated, { id, customerId: row.customer_id, active: false });
					this.announceDisabled(ctx, row.customer_id, view);
				}
				return { disabled: changed === 1, webhook: { ...view, customerId: row.customer_id } };
			},
		},

		/** The public record for other services that check ownership (meta.customerId); 404 otherwise. */
		find: {
			visibility: "public",
			params: zodParams(WebhookIdParams),
			async handler(this: WebhooksThis, ctx: Context<WebhookIdParams, TenantMeta>): Promise<WebhookView> {
				return this.present(await this.findOwned(this.tenantOf(ctx), ctx.params.id));
			},
		},
	},

	methods: {
		tenantOf(this: WebhooksThis, ctx: Context<unknown, TenantMeta>): string {
			const customerId = ctx.meta.customerId;
			if (typeof customerId !== "string" || customerId === "") {
				throw new ClientProblem(403, "forbidden", "No customer is attached to this call (meta.customerId)");
			}
			return customerId;
		},

		/** Another customer's webhook is reported exactly like a missing one. */
		async findOwned(this: WebhooksThis, customerId: string, id: string): Promise<WebhookRow> {
			const row: WebhookRow | undefined = await this.db("webhooks").where({ id, customer_id: customerId }).first();
			if (!row) throw new NotFoundError("Webhook");
			return row;
		},

		async unknownTopicProblems(this: WebhooksThis, ctx: Context, topics: string[], path: string): Promise<FieldProblem[]> {
			const catalogue: CatalogueTopic[] = await ctx.call("topics.list");
			const known = new Set(catalogue.filter(entry => entry.webhooks).map(entry => entry.topic));
			return topics
				.map((topic, index) => ({ topic, index }))
				.filter(({ topic }) => !known.has(topic))
				.map(({ topic, index }) => ({
					path: `${path}[${index}]`,
					message: `unknown event topic "${topic}": see GET ${WEBHOOK_TOPICS_PATH} for the topics a webhook can subscribe to`,
				}));
		},

		present(this: WebhooksThis, row: PublicWebhookRow): WebhookView {
			return {
				id: row.id,
				name: row.name,
				url: row.url,
				events: JSON.parse(row.events) as string[],
				active: Boolean(row.active),
				disabled_reason: row.active ? null : (row.disabled_reason ?? "user"),
				disabled_at: row.active ? null : (row.disabled_at ?? null),
				header_names: JSON.parse(row.header_names ?? "[]") as string[],
				created_at: row.created_at,
				updated_at: row.updated_at,
			};
		},

		announceDisabled(this: WebhooksThis, ctx: Context, customerId: string, view: WebhookView): void {
			const reason = view.disabled_reason ?? "user";
			this.disables.inc({ reason });
			this.logger.info(`Webhook ${view.id} of customer ${customerId} disabled (${reason})`);
			ctx.broadcast<WebhookDisabledEvent>(WEBHOOK_EVENTS.disabled, { id: view.id, customerId, name: view.name, url: view.url, reason, disabled_at: view.disabled_at ?? nowIso() });
		},

		seal(this: WebhooksThis, secret: string, id: string): string {
			return encryptSecret(secret, this.secretsKey, id);
		},

		secretsOf(this: WebhooksThis, row: WebhookRow): string[] {
			const open = (envelope: string) => {
				try {
					return decryptSecret(envelope, this.secretsKey, row.id);
				} catch {
					throw new Error(`The secret of webhook ${row.id} does not decrypt: is SECRETS_KEY the key it was encrypted with?`);
				}
			};
			const secrets = [open(row.secret_envelope)];
			const previousValid = row.previous_secret_envelope && row.previous_secret_expires_at && row.previous_secret_expires_at > nowIso();
			if (previousValid) secrets.push(open(row.previous_secret_envelope!));
			return secrets;
		},

		asConflict(this: WebhooksThis, err: unknown): unknown {
			const rule = brokenUniqueRule(err);
			if (rule === "name") return new ConflictError("Another of your webhooks already has this name");
			if (rule === "url") return new ConflictError("Another of your webhooks already sends to this URL");
			return err;
		},
	},

	created(this: WebhooksThis) {
		// Bad WEBHOOK_ALLOW_NETS or a missing key stop the service at start-up, not at the first request.
		this.allowList = parseAllowList(this.config.WEBHOOK_ALLOW_NETS);
		if (!this.config.SECRETS_KEY) throw new Error("SECRETS_KEY is not configured: webhook secrets cannot be encrypted");
		this.secretsKey = this.config.SECRETS_KEY;
		this.disables = counter(this.broker, "webhooks_disabled_total", "Webhooks disabled, by reason (user, gone, failing)", ["reason"]);
	},
};

export default WebhooksService;
