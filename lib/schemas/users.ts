// Schemas of the users service: the GET /user/details body, the PUT /user/settings body and
// the internal actions other services call (CONTRIBUTING.md, "users").
import { z } from "zod";
import { CustomerId, ExternalId } from "./events";
import { TopicName } from "./topics";

const MAX_CATEGORY_ENTRIES = 100;
const MAX_SETTINGS_PER_CATEGORY = 200;

/** What the gateway sends after verifying a token (lib/auth.ts Principal). */
export const TouchParams = z.object({
	userId: ExternalId,
	customerId: CustomerId,
	name: z.string().max(200).nullable(),
	email: z.string().max(320).nullable(),
	lastLogin: z.iso.datetime({ message: "must be an ISO 8601 timestamp" }).nullable(),
});
export type TouchParams = z.output<typeof TouchParams>;

/** GET /user/details takes nothing: the user comes from the token, never from the request. */
export const DetailsParams = z.object({}).strict();

/** One `{topic, email}` entry of PUT /user/settings. */
export const SettingUpdate = z
	.object({
		topic: z.string({ message: "must be a topic name (string)" }).max(100, "must be at most 100 characters"),
		email: z.boolean({ message: "must be true or false" }),
	})
	.strict();
export type SettingUpdate = z.output<typeof SettingUpdate>;

export const CategoryUpdate = z
	.object({
		category: z.string({ message: "must be a category name (string)" }).max(50, "must be at most 50 characters"),
		settings: z
			.array(SettingUpdate, { message: "must be a list of {topic, email}" })
			.max(MAX_SETTINGS_PER_CATEGORY, `must hold at most ${MAX_SETTINGS_PER_CATEGORY} entries`),
	})
	.strict();
export type CategoryUpdate = z.output<typeof CategoryUpdate>;

/**
 * The `notifications` list of PUT /user/settings. Null or absent means "change nothing", like an
 * empty list. Only its shape is checked here; whether each category and topic exists is checked
 * against the live catalogue (lib/notification-settings.ts).
 */
export const NotificationsUpdate = z
	.array(CategoryUpdate, { message: "must be a list of {category, settings}" })
	.max(MAX_CATEGORY_ENTRIES, `must hold at most ${MAX_CATEGORY_ENTRIES} entries`)
	.nullable()
	.optional();
export type NotificationsUpdate = z.output<typeof NotificationsUpdate>;

/**
 * The action's own check only rejects unknown top-level fields. The list itself is checked in
 * the handler, shape and catalogue together, so that one 422 names every problem at once
 * (a wrong type and an unknown topic in the same body are both reported).
 */
export const UpdateSettingsParams = z.object({ notifications: z.unknown().optional() }).strict();
export type UpdateSettingsParams = z.output<typeof UpdateSettingsParams>;

export const GetUserParams = z.object({ userId: ExternalId }).strict();
export const EmailPreferenceParams = z.object({ userId: ExternalId, topic: TopicName }).strict();
export const EmailRecipientsParams = z.object({ topic: TopicName }).strict();
export const SetEmailPreferenceParams = z
	.object({ userId: ExternalId, topic: TopicName, email: z.boolean({ message: "must be true or false" }) })
	.strict();
export type SetEmailPreferenceParams = z.output<typeof SetEmailPreferenceParams>;

/** A topic as listed under its category in GET /user/details. */
export const TopicSetting = z.object({
	topic: z.string(),
	name: z.string(),
	description: z.string(),
	email: z.boolean(),
});
export type TopicSetting = z.infer<typeof TopicSetting>;

export const CategorySettings = z.object({ category: z.string(), settings: z.array(TopicSetting) });
export type CategorySettings = z.infer<typeof CategorySettings>;

/** The body of GET /user/details and of a successful PUT /user/settings. */
export const UserDetails = z.object({
	user_id: z.string(),
	name: z.string().nullable(),
	email: z.string().nullable(),
	user_metadata: z.object({ notifications: z.array(CategorySettings) }),
	last_login: z.string().nullable(),
});
export type UserDetails = z.infer<typeof UserDetails>;

/** users.get: the user record as other services see it. */
export const UserRecord = z.object({
	user_id: z.string(),
	customer_id: z.string(),
	name: z.string().nullable(),
	email: z.string().nullable(),
	last_login: z.string().nullable(),
});
export type UserRecord = z.infer<typeof UserRecord>;

/** users.emailPreference and the entries of users.emailRecipients. */
export interface EmailRecipient {
	userId: string;
	customerId: string | null;
	name: string | null;
	email: string | null;
}
export interface EmailPreference extends EmailRecipient {
	enabled: boolean;
}

/**
 * Broadcast by the users service after it stored a change that may decide whether a user gets
 * email (a topic turned on or off, a new email address): whoever caches that answers it.
 */
export const EMAIL_PREFERENCE_CHANGED_EVENT = "users.emailPreferenceChanged";

export interface EmailPreferenceChangedEvent {
	userId: string;
}
