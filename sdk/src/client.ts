// The API client: one typed method per public endpoint, lists as async iterators that follow
// the `next` links, failures as typed errors carrying the problem details, and a bounded wait
// on 429 as the API's Retry-After asks.
import { errorFromResponse, RateLimitError, ServiceUnavailableError } from "./errors";
import type {
	CreateWebhookInput,
	Delivery,
	DeliveryStatus,
	DeliveryWithAttempts,
	EventTopic,
	Link,
	NotificationsInput,
	OrderStatusEventInput,
	PublishedEvents,
	PageInfo,
	UpdateWebhookInput,
	UserDetails,
	Webhook,
	WebhookTestResult,
	WebhookWithSecret,
	RecoverInput,
	RecoverResult,
	WebhookStats,
} from "./api-types";

export interface ClientOptions {
	/** Where the API runs, e.g. "https://api.example.com" (the /id/v3 prefix is added). */
	baseUrl: string;
	/** A bearer token, or a function returning a fresh one before each request. */
	token: string | (() => string | Promise<string>);
	/** How many times a 429 is retried after waiting its Retry-After. Default 2. */
	maxRetries?: number;
	/** The longest Retry-After waited; a longer one is thrown at once as RateLimitError. Default 30 s. */
	maxRetryDelayMs?: number;
	/** Sent as X-Request-Id on every request (else the gateway generates one). */
	requestId?: () => string;
	fetch?: typeof fetch;
}

export interface PageOptions {
	/** Page size, 1..100 (the API's default is 25). */
	perPage?: number;
}

export interface DeliveryListOptions extends PageOptions {
	status?: DeliveryStatus;
}

export interface Page<T> {
	items: T[];
	context: PageInfo;
	links: Link[];
}

/**
 * A list: `for await (const item of list)` walks every item across pages; `pages()` walks the
 * pages themselves (with their `context`). Nothing is requested until iteration starts.
 */
export class PageIterator<T> implements AsyncIterable<T> {
	constructor(private readonly fetchPage: (href: string) => Promise<Page<T>>, private readonly firstHref: string) {}

	async *pages(): AsyncGenerator<Page<T>> {
		let href: string | undefined = this.firstHref;
		while (href) {
			const page: Page<T> = await this.fetchPage(href);
			yield page;
			href = page.links.find(link => link.rel === "next")?.href;
		}
	}

	async *[Symbol.asyncIterator](): AsyncGenerator<T> {
		for await (const page of this.pages()) yield* page.items;
	}

	/** Every item, all pages read. */
	async toArray(): Promise<T[]> {
		const items: T[] = [];
		for await (const item of this) items.push(item);
		return items;
	}
}

const API_PREFIX = "/id/v3";
const DEFAULT_MAX_RETRIES = 2;
const DEFAULT_MAX_RETRY_DELAY_MS = 30_000;

interface RequestOptions {
	body?: unknown;
	headers?: Record<string, string>;
	/** The request may be repeated on 503 too (it is idempotent), within the same bounds as a 429. */
	repeatWhenUnavailable?: boolean;
}

interface Answer<T> {
	body: T;
	headers: Headers;
}

function query(values: Record<string, string | number | undefined>): string {
	const search = new URLSearchParams();
	for (const [name, value] of Object.entries(values)) if (value !== undefined) search.set(name, String(value));
	const text = search.toString();
	return text ? `?${text}` : "";
}

/** Retry-After is seconds or an HTTP date (RFC 9110). */
function retryAfterSeconds(header: string | null): number | undefined {
	if (!header) return undefined;
	if (/^\d+$/.test(header.trim())) return Number(header.trim());
	const at = Date.parse(header);
	return Number.isNaN(at) ? undefined : Math.max(0, Math.ceil((at - Date.now()) / 1000));
}

const segment = (id: string) => encodeURIComponent(id);

export class SatelliteWebhooksClient {
	private readonly origin: string;
	private readonly options: Required<Pick<ClientOptions, "maxRetries" | "maxRetryDelayMs">> & ClientOptions;

	constructor(options: ClientOptions) {
		const base = new URL(options.baseUrl);
		this.origin = base.origin + base.pathname.replace(/\/+$/, "").replace(/\/id\/v3$/, "");
		this.options = { maxRetries: DEFAULT_MAX_RETRIES, maxRetryDelayMs: DEFAULT_MAX_RETRY_DELAY_MS, ...options };
	}

	readonly topics = {
		/** GET /webhooks/events: the topics a webhook can subscribe to. */
		list: (): Promise<EventTopic[]> => this.call("GET", "/webhooks/events"),
	};

	readonly webhooks = {
		create: (input: CreateWebhookInput): Promise<WebhookWithSecret> => this.call("POST", "/webhooks", { body: input }),
		list: (options: PageOptions = {}): PageIterator<Webhook> =>
			this.pages(`/webhooks${query({ per_page: options.perPage })}`, (body: { webhooks: Webhook[]; context: PageInfo; links: Link[] }) => ({
				items: body.webhooks,
				context: body.context,
				links: body.links,
			})),
		get: (id: string): Promise<Webhook> => this.call("GET", `/webhooks/${segment(id)}`),
		update: (id: string, changes: UpdateWebhookInput): Promise<Webhook> => this.call("PATCH", `/webhooks/${segment(id)}`, { body: changes }),
		delete: async (id: string): Promise<void> => {
			await this.call("DELETE", `/webhooks/${segment(id)}`);
		},
		/** Sends a signed `webhook:test` event now and tells how the URL answered. */
		test: (id: string): Promise<WebhookTestResult> => this.call("POST", `/webhooks/${segment(id)}/test`),
		/** Issues a new secret; the old one keeps signing, as a second signature, during the grace period. */
		rotate: (id: string): Promise<WebhookWithSecret> => this.call("POST", `/webhooks/${segment(id)}/rotate`),
		/** After an outage: a fresh attempt now for every failed delivery created in the window (202). */
		recover: (id: string, window: RecoverInput): Promise<RecoverResult> => this.call("POST", `/webhooks/${segment(id)}/recover`, { body: window }),
		/** Deliveries and attempts per hour over the last 24 hours. */
		stats: (id: string): Promise<WebhookStats> => this.call("GET", `/webhooks/${segment(id)}/stats`),
	};

	readonly deliveries = {
		list: (webhookId: string, options: DeliveryListOptions = {}): PageIterator<Delivery> =>
			this.pages(
				`/webhooks/${segment(webhookId)}/deliveries${query({ status: options.status, per_page: options.perPage })}`,
				(body: { deliveries: Delivery[]; context: PageInfo; links: Link[] }) => ({ items: body.deliveries, context: body.context, links: body.links }),
			),
		get: (webhookId: string, deliveryId: string): Promise<DeliveryWithAttempts> =>
			this.call("GET", `/webhooks/${segment(webhookId)}/deliveries/${segment(deliveryId)}`),
		/** Schedules a fresh attempt now (202). */
		retry: (webhookId: string, deliveryId: string): Promise<Delivery> =>
			this.call("POST", `/webhooks/${segment(webhookId)}/deliveries/${segment(deliveryId)}/retry`),
	};

	readonly events = {
		/**
		 * POST /events/tasking.order_status (a token with the scope events:publish): one event or a
		 * list of at most 100, resolved once every one is stored durably. Each event without an
		 * event_id is given one here, so that the request can be repeated safely: a 503 is repeated
		 * after its Retry-After, as a 429 is. Answers the event_ids in the order sent.
		 */
		publish: (events: OrderStatusEventInput | OrderStatusEventInput[]): Promise<PublishedEvents> => {
			const withId = (event: OrderStatusEventInput) => (event.event_id === undefined ? { ...event, event_id: globalThis.crypto.randomUUID() } : event);
			const body = Array.isArray(events) ? events.map(withId) : withId(events);
			return this.call("POST", "/events/tasking.order_status", { body, repeatWhenUnavailable: true });
		},
	};

	readonly user = {
		details: async (): Promise<UserDetails & { etag: string | undefined }> => {
			const answer = await this.request<UserDetails>("GET", this.url("/user/details"));
			return { ...answer.body, etag: answer.headers.get("etag") ?? undefined };
		},
		/** Merges: only the topics sent change. With `ifMatch` (an etag), a concurrent change answers 412. */
		updateSettings: async (notifications: NotificationsInput, options: { ifMatch?: string } = {}): Promise<UserDetails & { etag: string | undefined }> => {
			const headers = options.ifMatch ? { "if-match": options.ifMatch } : undefined;
			const answer = await this.request<UserDetails>("PUT", this.url("/user/settings"), { body: { notifications }, headers });
			return { ...answer.body, etag: answer.headers.get("etag") ?? undefined };
		},
		/** Turns email for one topic on or off. */
		setEmail: (topic: string, email: boolean): Promise<UserDetails & { etag: string | undefined }> =>
			this.user.updateSettings([{ category: topic.split(":")[0], settings: [{ topic, email }] }]),
	};

	private url(path: string): string {
		return this.origin + API_PREFIX + path;
	}

	private pages<Body, T>(path: string, unpack: (body: Body) => Page<T>): PageIterator<T> {
		// `next` links are paths on the API's origin.
		return new PageIterator(async href => unpack((await this.request<Body>("GET", new URL(href, this.origin + "/").href)).body), this.url(path));
	}

	private async call<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
		return (await this.request<T>(method, this.url(path), options)).body;
	}

	private async request<T>(method: string, url: string, options: RequestOptions = {}): Promise<Answer<T>> {
		const doFetch = this.options.fetch ?? fetch;
		for (let attempt = 0; ; attempt++) {
			const token = typeof this.options.token === "function" ? await this.options.token() : this.options.token;
			const headers: Record<string, string> = { accept: "application/json", authorization: `Bearer ${token}`, ...options.headers };
			if (options.body !== undefined) headers["content-type"] = "application/json";
			if (this.options.requestId) headers["x-request-id"] = this.options.requestId();
			const response = await doFetch(url, { method, headers, body: options.body === undefined ? undefined : JSON.stringify(options.body) });
			const text = await response.text();
			let body: unknown = undefined;
			if (text) {
				try {
					body = JSON.parse(text);
				} catch {
					body = text;
				}
			}
			if (response.ok) return { body: body as T, headers: response.headers };
			const wait = retryAfterSeconds(response.headers.get("retry-after"));
			const error = errorFromResponse(response.status, response.statusText, body, response.headers.get("x-request-id") ?? undefined, wait);
			// A 429 changed nothing, so any method may be repeated, within the caller's bounds; a 503
			// only where repeating is harmless.
			const waitMs = (wait ?? 1) * 1000;
			const repeatable = error instanceof RateLimitError || (error instanceof ServiceUnavailableError && options.repeatWhenUnavailable === true);
			if (repeatable && attempt < this.options.maxRetries && waitMs <= this.options.maxRetryDelayMs) {
				await new Promise(resolve => setTimeout(resolve, waitMs));
				continue;
			}
			throw error;
		}
	}
}
