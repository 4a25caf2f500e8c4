// webhooks: owns the customers' webhooks (table `webhooks`): their URLs, event topics, status
// and signing secrets, which are encrypted at rest and rotated with a grace period, and custom
// request headers, whose values are encrypted the same way and never shown again (only names). Serves the
// /webhooks management routes, and gives the dispatcher the signing secrets in clear through
// `subscribers` and `resolve`, which the gateway does not expose. A webhook is disabled by its
// user (PATCH active=false) or by the dispatcher (`disable`: its URL answered 410 Gone, or every
// attempt failed for WEBHOOK_DISABLE_AFTER); the reason and time are kept until it is re-enabled.
//
// This file holds the /webhooks management routes (create, list, get, update, remove) and the
// helpers every part uses; the parts in mixins/webhooks/ hold the signing secrets and rotation
// (secrets.mixin.ts) and what other services ask (peers.mixin.ts). Row types and `WebhooksThis`
// are in mixins/webhooks/shared.ts.
import crypto from "node:crypto";
import type { Context, ServiceSchema, ServiceSettingSchema } from "moleculer";
import type { Knex } from "knex";
import { DbMixin, nowIso, sqliteFilename } from "../mixins/db.mixin";
import { sqliteReadCache, type SqliteReadConnection } from "../lib/sqlite-read-cache";
import { frozenAnswer } from "../lib/frozen-json";
import { zodParams } from "../mixins/validation";
import { webhooksMigrations, brokenUniqueRule } from "../migrations/webhooks";
import { ClientProblem, ConflictError, NotFoundError, UnprocessableError, type FieldProblem } from "../lib/errors";
import { generateWebhookSecret } from "../lib/crypto";
import { sealHeaders } from "../lib/webhook-headers";
import { RetentionMixin } from "../mixins/retention.mixin";
import { EXPIRED_PREVIOUS_SECRETS } from "../mixins/webhooks/retention";
import { PUBLIC_COLUMNS, type PublicWebhookRow, type TenantMeta, type WebhookRow, type WebhooksThis } from "../mixins/webhooks/shared";
import { SecretsMixin } from "../mixins/webhooks/secrets.mixin";
import { PeersMixin } from "../mixins/webhooks/peers.mixin";
import { parseAllowList } from "../lib/address-ranges";
import { buildPage, decodeCursor, type Cursor } from "../lib/pagination";
import { checkWebhookUrl } from "../lib/url-policy";
import { counter } from "../lib/metrics";
import type { CatalogueTopic } from "../lib/schemas/topics";
import {
	CreateWebhook,
	ListWebhooks,
	UpdateWebhook,
	WEBHOOK_EVENTS,
	WebhookIdParams,
	type WebhookChangedEvent,
	type WebhookDisabledEvent,
	type WebhookPage,
	type WebhookRemovedEvent,
	type WebhookView,
	type WebhookWithSecret,
} from "../lib/schemas/webhooks";

const LIST_PATH = "/id/v3/webhooks";
const WEBHOOK_TOPICS_PATH = "/id/v3/webhooks/events";

// Moleculer types a mixin with the base Service as `this`; the parts are typed with WebhooksThis.
const parts = [
	// action prune; RETENTION_PERIOD: previous secrets whose grace period is over
	RetentionMixin([EXPIRED_PREVIOUS_SECRETS]),
	// action rotate (POST /webhooks/{id}/rotate); seal, signingOf
	SecretsMixin,
	// actions subscribers, resolve, owner, disable, find (broker only, not routed by the gateway)
	PeersMixin,
] as Partial<ServiceSchema>[];

/** What GET /webhooks asks for: whose webhooks, how many, after which one. */
interface Listing {
	customerId: string;
	perPage: number;
	cursor: Cursor | undefined;
}

/** The rows of a page, oldest first, plus one that tells whether a next page exists. */
function pageQuery(db: Knex, { customerId, perPage, cursor }: Listing) {
	const query = db("webhooks")
		.select([...PUBLIC_COLUMNS])
		.where({ customer_id: customerId })
		.orderBy([{ column: "created_at" }, { column: "id" }])
		.limit(perPage + 1);
	return cursor
		? query.andWhere(after => after.where("created_at", ">", cursor.at).orWhere(tie => tie.where("created_at", "=", cursor.at).andWhere("id", ">", cursor.id)))
		: query;
}

function countQuery(db: Knex, customerId: string) {
	return db("webhooks").where({ customer_id: customerId }).count({ count: "*" });
}

/** A first page that holds everything already tells how many match. */
function everythingShown({ cursor, perPage }: Listing, rows: PublicWebhookRow[]): boolean {
	return !cursor && rows.length <= perPage;
}

function pageOf({ perPage }: Listing, rows: PublicWebhookRow[], matched: number, present: (row: PublicWebhookRow) => WebhookView): WebhookPage {
	const page = buildPage(
		rows,
		perPage,
		matched,
		row => ({ at: row.created_at, id: row.id }),
		present,
		next => `${LIST_PATH}?per_page=${perPage}&token=${encodeURIComponent(next)}`,
	);
	return { webhooks: page.items, context: page.context, links: page.links };
}

/** One page, read synchronously on SQLite (lib/sqlite-read-cache.ts) and frozen so that it can be kept. */
function readPageSync(db: Knex, connection: SqliteReadConnection, listing: Listing, present: (row: PublicWebhookRow) => WebhookView): Readonly<WebhookPage> {
	const run = (query: { toSQL(): Knex.Sql }) => {
		const { sql, bindings } = query.toSQL().toNative();
		return connection.prepare(sql).all(bindings) as Array<Record<string, unknown>>;
	};
	const rows = run(pageQuery(db, listing)) as unknown as PublicWebhookRow[];
	const matched = everythingShown(listing, rows) ? rows.length : Number(run(countQuery(db, listing.customerId))[0].count);
	return frozenAnswer(pageOf(listing, rows, matched, present));
}

function rejectIfAny(problems: FieldProblem[]): void {
	if (problems.length === 0) return;
	throw new UnprocessableError(problems.map(problem => `${problem.path}: ${problem.message}`).join("; "), problems);
}

const WebhooksService: ServiceSchema<ServiceSettingSchema, WebhooksThis> = {
	name: "webhooks",
	// DbMixin last: its hooks run first on created and started, and last on stopped.
	mixins: [...parts, DbMixin("webhooks", webhooksMigrations) as Partial<ServiceSchema>],

	actions: {
		/** POST /webhooks: the only answer, with rotate, that carries the secret. */
		create: {
			params: zodParams(CreateWebhook),
			async handler(this: WebhooksThis, ctx: Context<CreateWebhook, TenantMeta>): Promise<WebhookWithSecret> {
				const customerId = this.tenantOf(ctx);
				const { name, events, ordering, rate_limit } = ctx.params;
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
					ordering,
					rate_limit,
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
				ctx.broadcast<WebhookChangedEvent>(WEBHOOK_EVENTS.created, { id, customerId, active: true, ordering, rateLimit: rate_limit });
				return { ...this.present(row), secret };
			},
		},

		/** GET /webhooks: the caller's webhooks, oldest first, keyset-paged. */
		list: {
			params: zodParams(ListWebhooks),
			async handler(this: WebhooksThis, ctx: Context<ListWebhooks, TenantMeta>): Promise<WebhookPage> {
				const customerId = this.tenantOf(ctx);
				const { per_page: perPage, token } = ctx.params;
				const listing: Listing = { customerId, perPage, cursor: decodeCursor(token) };
				if (!this.listCache) {
					const rows: PublicWebhookRow[] = await pageQuery(this.db, listing);
					const matched = everythingShown(listing, rows) ? rows.length : Number((await countQuery(this.db, customerId))[0].count);
					return pageOf(listing, rows, matched, row => this.present(row));
				}
				// Embedded SQLite: the same statements, run synchronously; the page is kept, frozen, until
				// something is committed.
				return this.listCache.read(JSON.stringify(["list", customerId, perPage, token ?? null]), connection =>
					readPageSync(this.db, connection, listing, row => this.present(row)),
				);
			},
		},

		/** GET /webhooks/{id} */
		get: {
			params: zodParams(WebhookIdParams),
			async handler(this: WebhooksThis, ctx: Context<WebhookIdParams, TenantMeta>): Promise<WebhookView> {
				return this.present(await this.findOwned(this.tenantOf(ctx), ctx.params.id));
			},
		},

		/** PATCH /webhooks/{id}: name, events, active, headers, ordering and rate_limit may change; the URL may not. */
		update: {
			params: zodParams(UpdateWebhook),
			async handler(this: WebhooksThis, ctx: Context<UpdateWebhook, TenantMeta>): Promise<WebhookView> {
				const customerId = this.tenantOf(ctx);
				const { id, name, events, active, headers, ordering, rate_limit } = ctx.params;
				const row = await this.findOwned(customerId, id);
				if (events) rejectIfAny(await this.unknownTopicProblems(ctx, events, "events"));

				const changes: Partial<WebhookRow> = { updated_at: nowIso() };
				if (name !== undefined) changes.name = name;
				if (events !== undefined) changes.events = JSON.stringify(events);
				if (headers !== undefined) Object.assign(changes, sealHeaders(headers, this.secretsKey, id));
				if (ordering !== undefined) changes.ordering = ordering;
				if (rate_limit !== undefined) changes.rate_limit = rate_limit;
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
				// The ordering and rate limit after the change: a change to "none" lets the dispatcher
				// release what waits, and a new limit applies to what it sends next.
				ctx.broadcast<WebhookChangedEvent>(WEBHOOK_EVENTS.updated, { id, customerId, active: view.active, ordering: view.ordering, rateLimit: view.rate_limit });
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
				ordering: row.ordering,
				rate_limit: row.rate_limit ?? null,
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
		const filename = sqliteFilename(this.db);
		this.listCache = filename ? sqliteReadCache(filename) : undefined;
		this.disables = counter(this.broker, "webhooks_disabled_total", "Webhooks disabled, by reason (user, gone, failing)", ["reason"]);
	},

	stopped(this: WebhooksThis) {
		this.listCache?.close();
	},
};

export default WebhooksService;

