// A real stack for the dispatcher suites: gateway, webhooks, users, topics and dispatcher on a
// real database, plus a real HTTPS receiver (self-signed certificate, trusted through
// WEBHOOK_CA_FILE, loopback allowed through WEBHOOK_ALLOW_NETS). Each webhook gets its own path
// on the receiver, with its own scripted answers.
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import type { ServiceBroker } from "moleculer";
import { metricsOf } from "../../lib/metrics";
import { startStack, type Stack, type StackOptions } from "./stack";
import { pathOf, startHttpsReceiver, verifyDelivery, type HttpsReceiver, type ReceivedRequest, type Responder, type ScriptedResponse } from "./https-receiver";
import type { DatabaseKind } from "./services";
import type { TaskingOrderStatusInput } from "../../lib/schemas/events";

export const FAST_DELIVERY_ENV = {
	WEBHOOK_ALLOW_NETS: "127.0.0.0/8",
	DELIVERY_RETRY_SCHEDULE: "1s,2s,3s,4s,5s",
	DELIVERY_POLL_INTERVAL: "100ms",
};

/** Five retries, as FAST_DELIVERY_ENV has them, spent within 1 s instead of 5: for tests that need a delivery that has run out of them. */
export const SHORT_RETRY_SCHEDULE = "200ms,400ms,600ms,800ms,1s";

export interface CreatedWebhook {
	id: string;
	secret: string;
	url: string;
	/** The receiver path this webhook delivers to. */
	path: string;
}

export interface DeliveryStack {
	stack: Stack;
	receiver: HttpsReceiver;
	caFile: string;
	/** Creates a webhook through the API, delivering to its own receiver path. */
	createWebhook(token: string, options?: { events?: string[]; name?: string }): Promise<CreatedWebhook>;
	/** Scripted answers for one webhook's path, in order; afterwards `fallback` (200 by default). */
	script(webhook: CreatedWebhook, answers: Array<ScriptedResponse | Responder>, fallback?: ScriptedResponse | Responder): void;
	/** Requests that reached one webhook's path. */
	received(webhook: CreatedWebhook): ReceivedRequest[];
	stop(): Promise<void>;
}

let webhookCounter = 0;

export async function startDeliveryStack(database: DatabaseKind, options: Omit<StackOptions, "database"> & { receiver?: HttpsReceiver } = {}): Promise<DeliveryStack> {
	const receiver = options.receiver ?? (await startHttpsReceiver());
	const caFile = receiver.writeCaFile();
	const stack = await startStack({
		...options,
		database,
		env: { ...FAST_DELIVERY_ENV, WEBHOOK_CA_FILE: caFile, ...options.env },
	});

	const scripts = new Map<string, { answers: Array<ScriptedResponse | Responder>; fallback: ScriptedResponse | Responder }>();
	receiver.setDefault(request => {
		const script = scripts.get(pathOf(request));
		if (!script) return { status: 200, body: "ok" };
		const next = script.answers.shift() ?? script.fallback;
		return typeof next === "function" ? next(request) : next;
	});

	return {
		stack,
		receiver,
		caFile,
		async createWebhook(token, createOptions = {}) {
			const path = `/hooks/${++webhookCounter}`;
			const response = await stack.request("POST", "/id/v3/webhooks", {
				token,
				body: { name: createOptions.name ?? `hook ${webhookCounter}`, url: receiver.url + path, events: createOptions.events ?? ["tasking:order_status"] },
			});
			if (response.status !== 201) throw new Error(`webhook creation failed: ${response.status} ${response.text}`);
			return { id: response.body.id, secret: response.body.secret, url: response.body.url, path };
		},
		script(webhook, answers, fallback = { status: 200, body: "ok" }) {
			scripts.set(webhook.path, { answers: [...answers], fallback });
		},
		received(webhook) {
			return receiver.requests.filter(request => pathOf(request) === webhook.path);
		},
		async stop() {
			await stack.stop();
			if (!options.receiver) await receiver.close();
		},
	};
}

/** Polls until `done(value)`; the bound only turns a hang into a failure, it is no speed check. */
export async function waitUntil<T>(read: () => T | Promise<T>, done: (value: T) => boolean, what: string, boundMs = 30_000): Promise<T> {
	const giveUpAt = Date.now() + boundMs;
	for (;;) {
		const value = await read();
		if (done(value)) return value;
		if (Date.now() > giveUpAt) throw new Error(`Gave up waiting for ${what}; last value: ${JSON.stringify(value)?.slice(0, 2000)}`);
		await sleep(50);
	}
}

export { sleep };

/** Verifies a delivery's Standard Webhooks signature; returns the parsed payload. */
export function verified(request: ReceivedRequest, secret: string): any {
	return verifyDelivery(request, secret);
}

export type OrderEvent = TaskingOrderStatusInput;

export interface TestCustomer {
	id: string;
	userId: string;
	token: string;
}

/** A fresh customer with one user, so tests sharing a stack keep their webhooks apart. `signIn` records the user (with an email address). */
export async function newCustomer(stack: Stack, options: { signIn?: boolean } = {}): Promise<TestCustomer> {
	const id = `cust-${crypto.randomBytes(4).toString("hex")}`;
	const userId = `user-${id}`;
	const token = await stack.token(userId, { customer: id, email: `${userId}@example.com` });
	if (options.signIn) await stack.request("GET", "/id/v3/user/details", { token });
	return { id, userId, token };
}

/** A valid tasking order status event for the customer, with a fresh event_id. */
export function orderEvent(customer: { id: string; userId: string }, extra: Partial<OrderEvent> = {}): OrderEvent {
	return {
		event_id: crypto.randomUUID(),
		customer_id: customer.id,
		user_id: customer.userId,
		order_id: `order-${crypto.randomBytes(4).toString("hex")}`,
		status: "fulfilled",
		...extra,
	};
}

/**
 * Two dispatcher instances on one database for the enclosing describe block: `first`, the whole
 * delivery stack, and `second`, another broker running webhooks and a dispatcher on the same
 * data, as another instance would. Read them inside the tests (they exist once beforeAll ran).
 */
export function useTwoDispatchers(database: DatabaseKind, env: Record<string, string>): { readonly first: DeliveryStack; readonly second: Stack } {
	const instances = {} as { first: DeliveryStack; second: Stack };
	beforeAll(async () => {
		instances.first = await startDeliveryStack(database, { env });
		instances.second = await startStack({
			services: ["webhooks", "dispatcher"],
			database,
			dataDir: instances.first.stack.dataDir,
			schema: instances.first.stack.schema,
			env: { ...FAST_DELIVERY_ENV, ...env, WEBHOOK_CA_FILE: instances.first.caFile },
		});
	});
	afterAll(async () => {
		// The second leaves the shared data to the first.
		await instances.second?.stopServices();
		await instances.second?.db.destroy();
		await instances.first?.stop();
	});
	return instances;
}

/** A metric of this broker's registry, summed over the series whose labels include `labels`; 0 before it exists. */
export async function metricTotal(broker: ServiceBroker, name: string, labels: Record<string, string> = {}): Promise<number> {
	const metric = metricsOf(broker).getSingleMetric(name);
	const values = metric ? (await metric.get()).values : [];
	return values.filter(value => Object.entries(labels).every(([key, wanted]) => value.labels[key] === wanted)).reduce((sum, value) => sum + value.value, 0);
}

/** Delivery attempts this broker's dispatcher made, from its metrics; only those with `result` if given. */
export function attemptsMadeBy(broker: ServiceBroker, result?: "succeeded" | "failed"): Promise<number> {
	return metricTotal(broker, "webhook_delivery_attempts_total", result ? { result } : {});
}
