// topics: owns the event-topic catalogue (table `topics`). Seeded with tasking:order_status and
// the operational webhook:disabled (webhooks only, no email), each with the JSON Schema of its
// deliveries' data (generated from lib/schemas at every start, so it follows the code); other
// services may register more. Webhooks and users read it through `topics.list`.
import type { Context, ServiceSchema, ServiceSettingSchema } from "moleculer";
import { DbMixin, nowIso, type DbServiceThis } from "../mixins/db.mixin";
import { zodParams } from "../mixins/validation";
import { topicsMigrations } from "../migrations/topics";
import { TASKING_ORDER_STATUS, UNDESCRIBED_DATA, WEBHOOK_DISABLED, TopicRegistration, type CatalogueTopic, type WebhookTopic } from "../lib/schemas/topics";

interface TopicRow {
	topic: string;
	category: string;
	name: string;
	description: string;
	email_capable: boolean | number;
	webhook_capable: boolean | number;
	data_schema: string | null;
}

type TopicsThis = DbServiceThis & {
	catalogue: CatalogueTopic[] | null;
	loadCatalogue(): Promise<CatalogueTopic[]>;
	upsertTopic(registration: TopicRegistration): Promise<void>;
};

const TopicsService: ServiceSchema<ServiceSettingSchema, TopicsThis> = {
	name: "topics",
	mixins: [DbMixin("topics", topicsMigrations) as Partial<ServiceSchema>],

	settings: {
		seed: [TASKING_ORDER_STATUS, WEBHOOK_DISABLED],
	},

	actions: {
		/** The whole catalogue, ordered by topic. */
		list: {
			async handler(this: TopicsThis): Promise<CatalogueTopic[]> {
				return this.catalogue ?? (await this.loadCatalogue());
			},
		},

		/** GET /webhooks/events: the topics a webhook may subscribe to, with the schema of their data. */
		webhookTopics: {
			async handler(this: TopicsThis): Promise<WebhookTopic[]> {
				const catalogue = this.catalogue ?? (await this.loadCatalogue());
				return catalogue.filter(entry => entry.webhooks).map(({ topic, name, description, schema }) => ({ topic, name, description, schema }));
			},
		},

		/** Adds or updates a topic. Other services call this at start-up to add their own events. */
		register: {
			params: zodParams(TopicRegistration),
			async handler(this: TopicsThis, ctx: Context<TopicRegistration>): Promise<CatalogueTopic[]> {
				await this.upsertTopic(ctx.params);
				const catalogue = await this.loadCatalogue();
				ctx.broadcast("topics.changed", { topic: ctx.params.topic });
				return catalogue;
			},
		},
	},

	events: {
		// Another topics instance (distributed mode) changed the catalogue.
		"topics.changed"(this: TopicsThis) {
			this.catalogue = null;
		},
	},

	methods: {
		async loadCatalogue(this: TopicsThis): Promise<CatalogueTopic[]> {
			const rows: TopicRow[] = await this.db("topics").select().orderBy("topic");
			this.catalogue = rows.map(row => ({
				topic: row.topic,
				category: row.category,
				name: row.name,
				description: row.description,
				email: Boolean(row.email_capable),
				webhooks: Boolean(row.webhook_capable),
				schema: row.data_schema === null ? UNDESCRIBED_DATA : (JSON.parse(row.data_schema) as CatalogueTopic["schema"]),
			}));
			return this.catalogue;
		},

		async upsertTopic(this: TopicsThis, registration: TopicRegistration): Promise<void> {
			const now = nowIso();
			await this.db("topics")
				.insert({
					topic: registration.topic,
					category: registration.category,
					name: registration.name,
					description: registration.description,
					email_capable: registration.email,
					webhook_capable: registration.webhooks,
					data_schema: registration.schema === undefined ? null : JSON.stringify(registration.schema),
					created_at: now,
					updated_at: now,
				})
				.onConflict("topic")
				.merge(["category", "name", "description", "email_capable", "webhook_capable", "data_schema", "updated_at"]);
		},
	},

	created(this: TopicsThis) {
		this.catalogue = null;
	},

	async started(this: TopicsThis) {
		for (const registration of this.settings.seed as TopicRegistration[]) await this.upsertTopic(registration);
		await this.loadCatalogue();
	},
};

export default TopicsService;
