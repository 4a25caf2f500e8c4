// users: owns the user records (table `users`, filled from verified token claims) and their
// email notification preferences (table `user_email_preferences`, one row per user and topic).
// Serves GET /user/details and PUT /user/settings, and tells the notifier who wants which email.
// After storing a change that may decide whether a user gets email (a preference, an address),
// it broadcasts `users.emailPreferenceChanged {userId}`: the notifiers cache that answer.
import type { Knex } from "knex";
import type { Context, ServiceSchema, ServiceSettingSchema } from "moleculer";
import { DbMixin, isPostgres, nowIso, type DbServiceThis } from "../mixins/db.mixin";
import { zodParams } from "../mixins/validation";
import { usersMigrations } from "../migrations/users";
import { NotFoundError, PreconditionFailedError, invalidField } from "../lib/errors";
import { strongEtag, ifMatchSatisfied } from "../lib/etag";
import { emailCapableTopics, groupByCategory, mergeNotificationSettings, parseSettingsUpdate } from "../lib/notification-settings";
import type { GatewayMeta } from "../lib/gateway-meta";
import type { CatalogueTopic } from "../lib/schemas/topics";
import {
	DetailsParams,
	EmailPreferenceParams,
	EmailRecipientsParams,
	GetUserParams,
	SetEmailPreferenceParams,
	TouchParams,
	UpdateSettingsParams,
	EMAIL_PREFERENCE_CHANGED_EVENT,
	type EmailPreference,
	type EmailPreferenceChangedEvent,
	type EmailRecipient,
	type SettingUpdate,
	type UserDetails,
	type UserRecord,
} from "../lib/schemas/users";

// Fingerprints of claims already known to be stored, so that repeated requests cost no query.
const TOUCH_CACHE_MAX = 10_000;

interface UserRow {
	user_id: string;
	customer_id: string;
	name: string | null;
	email: string | null;
	last_login: string | null;
	created_at: string;
	updated_at: string;
}

type UserFields = Pick<UserRow, "customer_id" | "name" | "email" | "last_login">;

/** The part of what the gateway puts in ctx.meta that this service reads and sets. */
type UsersMeta = Pick<GatewayMeta, "userId" | "principal" | "ifMatch" | "etag">;

type Queryable = Knex | Knex.Transaction;

type UsersThis = DbServiceThis & {
	touchedFingerprints: Map<string, string>;
	touchUser(claims: TouchParams): Promise<boolean>;
	emailTopics(ctx: Context): Promise<CatalogueTopic[]>;
	findUser(db: Queryable, userId: string): Promise<UserRow | undefined>;
	lockUser(trx: Knex.Transaction, userId: string): Promise<UserRow>;
	currentUser(ctx: Context<unknown, UsersMeta>): Promise<UserRow>;
	enabledTopics(db: Queryable, userId: string): Promise<Set<string>>;
	writePreferences(trx: Knex.Transaction, userId: string, changes: SettingUpdate[]): Promise<boolean>;
	announceEmailPreferenceChange(userId: string): void;
};

/**
 * The fields to store for these claims, or null when the stored row already says the same.
 * A claim the token lacks (no name, no email) keeps the stored value rather than erasing it,
 * and claims from a token older than the last login seen are ignored, so that a user with an
 * old and a new token in use does not flip the record (and write) on every request.
 */
function fieldsToStore(row: UserRow | undefined, claims: TouchParams): UserFields | null {
	const lastLogin = claims.lastLogin === null ? null : new Date(claims.lastLogin).toISOString();
	if (!row) return { customer_id: claims.customerId, name: claims.name, email: claims.email, last_login: lastLogin };
	if (lastLogin !== null && row.last_login !== null && lastLogin < row.last_login) return null;
	const next: UserFields = {
		customer_id: claims.customerId,
		name: claims.name ?? row.name,
		email: claims.email ?? row.email,
		last_login: lastLogin ?? row.last_login,
	};
	const unchanged = (Object.keys(next) as Array<keyof UserFields>).every(field => next[field] === row[field]);
	return unchanged ? null : next;
}

function detailsBody(user: UserRow, emailTopics: CatalogueTopic[], enabledTopics: ReadonlySet<string>): UserDetails {
	return {
		user_id: user.user_id,
		name: user.name,
		email: user.email,
		user_metadata: { notifications: groupByCategory(emailTopics, enabledTopics) },
		last_login: user.last_login,
	};
}

function recipientOf(user: Pick<UserRow, "user_id" | "customer_id" | "name" | "email">): EmailRecipient {
	return { userId: user.user_id, customerId: user.customer_id, name: user.name, email: user.email };
}

const UsersService: ServiceSchema<ServiceSettingSchema, UsersThis> = {
	name: "users",
	mixins: [DbMixin("users", usersMigrations) as Partial<ServiceSchema>],

	actions: {
		/** Called by the gateway with each verified token's claims. Writes only when something changed. */
		touch: {
			params: zodParams(TouchParams),
			async handler(this: UsersThis, ctx: Context<TouchParams>): Promise<{ changed: boolean }> {
				return { changed: await this.touchUser(ctx.params) };
			},
		},

		/** GET /user/details: the caller's record and every email-capable topic with its state. */
		details: {
			params: zodParams(DetailsParams),
			async handler(this: UsersThis, ctx: Context<unknown, UsersMeta>): Promise<UserDetails> {
				const emailTopics = await this.emailTopics(ctx);
				const user = await this.currentUser(ctx);
				const body = detailsBody(user, emailTopics, await this.enabledTopics(this.db, user.user_id));
				ctx.meta.etag = strongEtag(body);
				return body;
			},
		},

		/**
		 * PUT /user/settings: merges the topics sent into the caller's preferences. With If-Match,
		 * the tag check and the write happen under one lock, so a stale tag changes nothing.
		 */
		updateSettings: {
			params: zodParams(UpdateSettingsParams),
			async handler(this: UsersThis, ctx: Context<UpdateSettingsParams, UsersMeta>): Promise<UserDetails> {
				// Fetched before the transaction: on SQLite the transaction holds the only connection,
				// which the topics service may need.
				const emailTopics = await this.emailTopics(ctx);
				const requested = parseSettingsUpdate(ctx.params.notifications, emailTopics);
				const { user_id: userId } = await this.currentUser(ctx);
				const ifMatch = ctx.meta.ifMatch;

				const { body, changed } = await this.db.transaction(async trx => {
					const user = await this.lockUser(trx, userId);
					const enabled = await this.enabledTopics(trx, userId);
					if (ifMatch !== undefined && !ifMatchSatisfied(ifMatch, strongEtag(detailsBody(user, emailTopics, enabled)))) {
						throw new PreconditionFailedError();
					}
					const merged = mergeNotificationSettings(enabled, requested);
					return { body: detailsBody(user, emailTopics, merged.enabled), changed: await this.writePreferences(trx, userId, merged.changed) };
				});
				if (changed) this.announceEmailPreferenceChange(userId);
				ctx.meta.etag = strongEtag(body);
				return body;
			},
		},

		/** The user record as other services see it. */
		get: {
			params: zodParams(GetUserParams),
			async handler(this: UsersThis, ctx: Context<{ userId: string }>): Promise<UserRecord> {
				const user = await this.findUser(this.db, ctx.params.userId);
				if (!user) throw new NotFoundError("User");
				return { user_id: user.user_id, customer_id: user.customer_id, name: user.name, email: user.email, last_login: user.last_login };
			},
		},

		/** Whether one user wants email for one topic, with the address to send it to. */
		emailPreference: {
			params: zodParams(EmailPreferenceParams),
			async handler(this: UsersThis, ctx: Context<{ userId: string; topic: string }>): Promise<EmailPreference> {
				const { userId, topic } = ctx.params;
				const capable = (await this.emailTopics(ctx)).some(entry => entry.topic === topic);
				const user = await this.findUser(this.db, userId);
				if (!user) return { userId, customerId: null, name: null, email: null, enabled: false };
				const enabled = capable && (await this.enabledTopics(this.db, userId)).has(topic);
				return { ...recipientOf(user), enabled };
			},
		},

		/** Every user who turned email on for the topic (none when the topic has no email). */
		emailRecipients: {
			params: zodParams(EmailRecipientsParams),
			async handler(this: UsersThis, ctx: Context<{ topic: string }>): Promise<EmailRecipient[]> {
				const { topic } = ctx.params;
				if (!(await this.emailTopics(ctx)).some(entry => entry.topic === topic)) return [];
				const rows: Array<Pick<UserRow, "user_id" | "customer_id" | "name" | "email">> = await this.db("user_email_preferences as p")
					.join("users as u", "u.user_id", "p.user_id")
					.where({ "p.topic": topic, "p.email": true })
					.select("u.user_id", "u.customer_id", "u.name", "u.email")
					.orderBy("u.user_id");
				return rows.map(recipientOf);
			},
		},

		/** Turns one topic's email on or off for a user: the one-click unsubscribe uses it. */
		setEmailPreference: {
			params: zodParams(SetEmailPreferenceParams),
			async handler(this: UsersThis, ctx: Context<SetEmailPreferenceParams>): Promise<SetEmailPreferenceParams> {
				const { userId, topic, email } = ctx.params;
				if (!(await this.emailTopics(ctx)).some(entry => entry.topic === topic)) {
					throw invalidField("topic", `Topic "${topic}" has no email notifications`);
				}
				const changed = await this.db.transaction(async trx => {
					await this.lockUser(trx, userId);
					const merged = mergeNotificationSettings(await this.enabledTopics(trx, userId), [{ topic, email }]);
					return this.writePreferences(trx, userId, merged.changed);
				});
				if (changed) this.announceEmailPreferenceChange(userId);
				return { userId, topic, email };
			},
		},
	},

	methods: {
		async touchUser(this: UsersThis, claims: TouchParams): Promise<boolean> {
			const fingerprint = JSON.stringify([claims.customerId, claims.name, claims.email, claims.lastLogin]);
			if (this.touchedFingerprints.get(claims.userId) === fingerprint) return false;

			const row = await this.findUser(this.db, claims.userId);
			const fields = fieldsToStore(row, claims);
			if (fields) {
				const now = nowIso();
				if (row) {
					await this.db("users").where({ user_id: claims.userId }).update({ ...fields, updated_at: now });
				} else {
					// Two first requests of a new user may race: the second one refreshes the first.
					await this.db("users")
						.insert({ user_id: claims.userId, ...fields, created_at: now, updated_at: now })
						.onConflict("user_id")
						.merge(["customer_id", "name", "email", "last_login", "updated_at"]);
				}
				if (fields.email !== (row?.email ?? null)) this.announceEmailPreferenceChange(claims.userId);
			}
			if (this.touchedFingerprints.size >= TOUCH_CACHE_MAX) this.touchedFingerprints.clear();
			this.touchedFingerprints.set(claims.userId, fingerprint);
			return fields !== null;
		},

		async emailTopics(this: UsersThis, ctx: Context): Promise<CatalogueTopic[]> {
			return emailCapableTopics(await ctx.call<CatalogueTopic[]>("topics.list"));
		},

		async findUser(this: UsersThis, db: Queryable, userId: string): Promise<UserRow | undefined> {
			return db<UserRow>("users").where({ user_id: userId }).first();
		},

		/** Reads the user row inside a transaction, locking it on PostgreSQL (SQLite has a single writer). */
		async lockUser(this: UsersThis, trx: Knex.Transaction, userId: string): Promise<UserRow> {
			const query = trx<UserRow>("users").where({ user_id: userId }).first();
			const user = await (isPostgres(trx) ? query.forUpdate() : query);
			if (!user) throw new NotFoundError("User");
			return user;
		},

		/** The caller's record. A request that skipped touch (e.g. a cleared database) creates it from the token. */
		async currentUser(this: UsersThis, ctx: Context<unknown, UsersMeta>): Promise<UserRow> {
			const { userId, principal } = ctx.meta;
			if (!userId) throw new NotFoundError("User");
			let user = await this.findUser(this.db, userId);
			if (!user && principal?.userId === userId) {
				this.touchedFingerprints.delete(userId);
				await this.touchUser(principal);
				user = await this.findUser(this.db, userId);
			}
			if (!user) throw new NotFoundError("User");
			return user;
		},

		async enabledTopics(this: UsersThis, db: Queryable, userId: string): Promise<Set<string>> {
			const rows: Array<{ topic: string }> = await db("user_email_preferences").where({ user_id: userId, email: true }).select("topic");
			return new Set(rows.map(row => row.topic));
		},

		/** Stores the changes; answers whether there were any. */
		async writePreferences(this: UsersThis, trx: Knex.Transaction, userId: string, changes: SettingUpdate[]): Promise<boolean> {
			if (changes.length === 0) return false;
			const now = nowIso();
			await trx("user_email_preferences")
				.insert(changes.map(({ topic, email }) => ({ user_id: userId, topic, email, updated_at: now })))
				.onConflict(["user_id", "topic"])
				.merge(["email", "updated_at"]);
			return true;
		},

		/**
		 * Called once the change is stored (committed). Broadcast, not emit: every notifier instance
		 * keeps its own cache. Not awaited by the request: the change is stored, and a notifier that
		 * misses this hears of it through its cache's expiry or a reconnection.
		 */
		announceEmailPreferenceChange(this: UsersThis, userId: string): void {
			this.broker.broadcast<EmailPreferenceChangedEvent>(EMAIL_PREFERENCE_CHANGED_EVENT, { userId }).catch(err => {
				this.logger.warn(`Could not announce the email preference change of user ${userId}`, err);
			});
		},
	},

	created(this: UsersThis) {
		this.touchedFingerprints = new Map();
	},
};

export default UsersService;
