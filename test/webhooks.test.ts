// Webhook management through the real gateway (API.md, "Webhooks"), and the internal actions
// and events the dispatcher relies on (CONTRIBUTING.md, "webhooks"), on SQLite and PostgreSQL.
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import type { Knex } from "knex";
import type { Service } from "moleculer";
import { expectProblem, startStack, type Stack } from "./helpers/stack";
import { testDatabases } from "./helpers/services";
import { scratchDatabase, type ScratchDatabase } from "./helpers/scratch-database";
import { runMigrations } from "../mixins/db.mixin";
import { webhooksMigrations } from "../migrations/webhooks";
import { encryptSecret, generateWebhookSecret } from "../lib/crypto";

const SERVICES = ["api", "topics", "webhooks"] as const;
const ORDER_STATUS = "tasking:order_status";
const CAPTURE_READY = "imaging:capture_ready";
const SECRET_FORM = /^whsec_[A-Za-z0-9+/]{43}=$/;
const ISO_TIME = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/;

interface RecordedEvent {
	name: string;
	payload: Record<string, unknown>;
}

async function waitFor<T>(read: () => Promise<T>, done: (value: T) => boolean, what: string): Promise<T> {
	// A bound on the wait only, so a broken build fails instead of hanging; never a speed check.
	const giveUpAt = Date.now() + 30_000;
	for (;;) {
		const value = await read();
		if (done(value)) return value;
		if (Date.now() > giveUpAt) throw new Error(`Gave up waiting for ${what}; last value: ${JSON.stringify(value)}`);
		await sleep(100);
	}
}

describe.each(testDatabases())("webhooks on %s", database => {
	let stack: Stack;
	let alice: string;
	let bob: string;
	let carol: string;
	const events: RecordedEvent[] = [];
	let counter = 0;

	const uniqueUrl = () => `https://hooks.example.com/${database}/${++counter}`;
	const create = (token: string, body: Record<string, unknown>) => stack.request("POST", "/id/v3/webhooks", { token, body });
	const newWebhook = async (token: string, overrides: Record<string, unknown> = {}) => {
		const response = await create(token, { name: `hook ${++counter}`, url: uniqueUrl(), events: [ORDER_STATUS], ...overrides });
		expect(response.status).toBe(201);
		return response.body as { id: string; secret: string; name: string; url: string; events: string[]; active: boolean; rate_limit: number | null; created_at: string; updated_at: string };
	};

	beforeAll(async () => {
		stack = await startStack({ services: [...SERVICES], database });
		alice = await stack.token("alice");
		// bob and carol belong to the same customer: the webhooks are acme's, not theirs.
		bob = await stack.token("bob", { customer: "acme" });
		carol = await stack.token("carol", { customer: "acme" });
		await stack.app.broker.call("topics.register", {
			topic: CAPTURE_READY,
			category: "imaging",
			name: "Capture ready",
			description: "A capture is ready for download",
		});
		const record = (name: string) =>
			function (this: Service, payload: Record<string, unknown>) {
				events.push({ name, payload });
			};
		// A real subscriber on the same broker, as the dispatcher would be.
		stack.app.broker.createService({
			name: "webhook-events-listener",
			events: {
				"webhooks.created": record("webhooks.created"),
				"webhooks.updated": record("webhooks.updated"),
				"webhooks.removed": record("webhooks.removed"),
				"webhooks.rotated": record("webhooks.rotated"),
			},
		});
		await stack.app.broker.waitForServices("webhook-events-listener");
	});
	afterAll(() => stack?.stop());

	it("creates a webhook: 201, Location, the record and a fresh secret shown once", async () => {
		const response = await create(alice, { name: "  Orders to ERP  ", url: "https://Hooks.Example.com:443/satellite?via=erp", events: [ORDER_STATUS] });
		expect(response.status).toBe(201);
		const body = response.body;
		expect(body).toEqual({
			id: expect.stringMatching(/^[0-9a-f-]{36}$/),
			name: "Orders to ERP",
			url: "https://hooks.example.com/satellite?via=erp",
			events: [ORDER_STATUS],
			active: true,
			disabled_reason: null,
			disabled_at: null,
			header_names: [],
			ordering: "per_order",
			rate_limit: null,
			created_at: expect.stringMatching(ISO_TIME),
			updated_at: body.created_at,
			secret: expect.stringMatching(SECRET_FORM),
		});
		expect(Buffer.from(body.secret.slice("whsec_".length), "base64")).toHaveLength(32);
		expect(response.headers.get("location")).toBe(`/id/v3/webhooks/${body.id}`);

		const fetched = await stack.request("GET", response.headers.get("location")!, { token: alice });
		expect(fetched.status).toBe(200);
		const { secret, ...withoutSecret } = body;
		expect(fetched.body).toEqual(withoutSecret);
		expect(fetched.text).not.toContain(secret);
	});

	it("gives every webhook its own secret", async () => {
		const first = await newWebhook(alice);
		const second = await newWebhook(alice);
		expect(first.secret).not.toBe(second.secret);
	});

	it("accepts event_types in place of events, both when they agree, and deduplicates topics", async () => {
		const viaEventTypes = await create(alice, { name: "via event_types", url: uniqueUrl(), event_types: [ORDER_STATUS] });
		expect(viaEventTypes.status).toBe(201);
		expect(viaEventTypes.body.events).toEqual([ORDER_STATUS]);
		expect(viaEventTypes.body).not.toHaveProperty("event_types");

		const both = await create(alice, { name: "via both", url: uniqueUrl(), events: [ORDER_STATUS, CAPTURE_READY], event_types: [CAPTURE_READY, ORDER_STATUS] });
		expect(both.status).toBe(201);
		expect(both.body.events).toEqual([ORDER_STATUS, CAPTURE_READY]);

		const duplicates = await create(alice, { name: "duplicates", url: uniqueUrl(), events: [ORDER_STATUS, CAPTURE_READY, ORDER_STATUS] });
		expect(duplicates.status).toBe(201);
		expect(duplicates.body.events).toEqual([ORDER_STATUS, CAPTURE_READY]);
	});

	it("serves every route with and without a trailing slash", async () => {
		const created = await stack.request("POST", "/id/v3/webhooks/", { token: alice, body: { name: "slash", url: uniqueUrl(), events: [ORDER_STATUS] } });
		expect(created.status).toBe(201);
		const id = created.body.id;
		expect((await stack.request("GET", "/id/v3/webhooks/", { token: alice })).status).toBe(200);
		expect((await stack.request("GET", `/id/v3/webhooks/${id}/`, { token: alice })).body.id).toBe(id);
		expect((await stack.request("PATCH", `/id/v3/webhooks/${id}/`, { token: alice, body: { name: "slash renamed" } })).body.name).toBe("slash renamed");
		const rotated = await stack.request("POST", `/id/v3/webhooks/${id}/rotate/`, { token: alice });
		expect(rotated.status).toBe(200);
		expect(rotated.body.secret).toMatch(SECRET_FORM);
		expect((await stack.request("DELETE", `/id/v3/webhooks/${id}/`, { token: alice })).status).toBe(204);
	});

	it("answers 409 for a second webhook with the same name or the same (normalised) URL of one customer", async () => {
		const existing = await newWebhook(alice, { url: "https://dupes.example.com/in" });
		const sameName = await create(alice, { name: `  ${existing.name}`, url: uniqueUrl(), events: [ORDER_STATUS] });
		expectProblem(sameName, 409);
		expect(sameName.body.detail).toMatch(/name/);

		const sameUrl = await create(alice, { name: "other name", url: "https://DUPES.example.com:443/in", events: [ORDER_STATUS] });
		expectProblem(sameUrl, 409);
		expect(sameUrl.body.detail).toMatch(/URL/);

		// Renaming onto a taken name is a conflict too.
		const renamed = await stack.request("PATCH", `/id/v3/webhooks/${(await newWebhook(alice)).id}`, { token: alice, body: { name: existing.name } });
		expectProblem(renamed, 409);

		// Another customer may use the same name and URL.
		const elsewhere = await create(bob, { name: existing.name, url: existing.url, events: [ORDER_STATUS] });
		expect(elsewhere.status).toBe(201);
	});

	it("lets only one of two concurrent creates with the same name win", async () => {
		const body = (n: number) => ({ name: "race", url: `https://race.example.com/${database}/${n}`, events: [ORDER_STATUS] });
		const answers = await Promise.all([1, 2, 3, 4].map(n => create(alice, body(n))));
		expect(answers.map(answer => answer.status).sort()).toEqual([201, 409, 409, 409]);
	});

	it("pages through a customer's webhooks with next links until they are exhausted", async () => {
		const pager = await stack.token("pager", { customer: `paging-${database}` });
		const created = [];
		for (let i = 0; i < 5; i += 1) created.push(await newWebhook(pager));

		const seen: Array<{ id: string; created_at: string }> = [];
		const returnedPerPage: number[] = [];
		let next: string | undefined = "/id/v3/webhooks?per_page=2";
		while (next) {
			const page = await stack.request("GET", next, { token: pager });
			expect(page.status).toBe(200);
			expect(page.body.context).toEqual({ per_page: 2, matched: 5, returned: page.body.webhooks.length });
			seen.push(...page.body.webhooks);
			returnedPerPage.push(page.body.webhooks.length);
			const link = page.body.links.find((candidate: { rel: string }) => candidate.rel === "next");
			if (link) {
				expect(link).toEqual({ rel: "next", href: expect.stringMatching(/^\/id\/v3\/webhooks\?per_page=2&token=[\w%-]+$/), method: "GET" });
			} else {
				expect(page.body.links).toEqual([]);
			}
			next = link?.href;
		}
		expect(returnedPerPage).toEqual([2, 2, 1]);
		expect(seen.map(webhook => webhook.id).sort()).toEqual(created.map(webhook => webhook.id).sort());
		// Oldest first, ties broken by id: the order the keyset relies on.
		const order = seen.map(webhook => `${webhook.created_at} ${webhook.id}`);
		expect(order).toEqual([...order].sort());
		for (const webhook of seen) expect(webhook).not.toHaveProperty("secret");

		const all = await stack.request("GET", "/id/v3/webhooks", { token: pager });
		expect(all.body.context).toEqual({ per_page: 25, matched: 5, returned: 5 });
		expect(all.body.links).toEqual([]);
	});

	it("lists nothing, with no next link, for a customer without webhooks", async () => {
		const nobody = await stack.token("nobody");
		const response = await stack.request("GET", "/id/v3/webhooks", { token: nobody });
		expect(response.status).toBe(200);
		expect(response.body).toEqual({ webhooks: [], context: { per_page: 25, matched: 0, returned: 0 }, links: [] });
	});

	// On SQLite a listing is kept until something is committed (lib/sqlite-read-cache.ts): each
	// way of changing a webhook must show in the very next listing.
	it("shows every change in the next listing, whichever path made it", async () => {
		const lister = await stack.token("lister", { customer: `listing-${database}` });
		const listed = async () => (await stack.request("GET", "/id/v3/webhooks", { token: lister })).body.webhooks as Array<Record<string, unknown>>;
		expect(await listed()).toEqual([]);
		const webhook = await newWebhook(lister);
		expect((await listed()).map(entry => entry.id)).toEqual([webhook.id]);

		await stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: lister, body: { name: "Renamed in the API" } });
		expect(await listed()).toEqual([expect.objectContaining({ id: webhook.id, name: "Renamed in the API" })]);

		// The dispatcher's path: a 410 Gone disables the webhook through an action.
		await stack.app.broker.call("webhooks.disable", { id: webhook.id, reason: "gone" });
		expect(await listed()).toEqual([expect.objectContaining({ id: webhook.id, active: false, disabled_reason: "gone" })]);

		// Another connection to the database (an operator's, another process's).
		await stack.db("webhooks").where({ id: webhook.id }).update({ name: "Renamed elsewhere" });
		expect(await listed()).toEqual([expect.objectContaining({ id: webhook.id, name: "Renamed elsewhere" })]);

		// An in-process caller gets the very page that is kept (frozen) on SQLite, a page of its own on
		// PostgreSQL: either way, what it does with it cannot change the next listing.
		const page = await stack.app.broker.call<{ webhooks: Array<{ name: string }> }, object>("webhooks.list", {}, { meta: { customerId: `listing-${database}` } });
		expect(Object.isFrozen(page.webhooks[0])).toBe(database === "sqlite");
		if (!Object.isFrozen(page.webhooks[0])) page.webhooks[0].name = "changed by a caller";
		expect((await listed())[0].name).toBe("Renamed elsewhere");

		await stack.request("DELETE", `/id/v3/webhooks/${webhook.id}`, { token: lister });
		expect(await listed()).toEqual([]);
	});

	it("updates name, events (or event_types) and status with PATCH", async () => {
		const webhook = await newWebhook(alice);
		const renamed = await stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice, body: { name: " Renamed " } });
		expect(renamed.status).toBe(200);
		expect(renamed.body).toEqual({ ...webhook, secret: undefined, name: "Renamed", updated_at: expect.stringMatching(ISO_TIME) });
		expect(renamed.body.updated_at >= webhook.updated_at).toBe(true);

		const retopic = await stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice, body: { events: [CAPTURE_READY, ORDER_STATUS, CAPTURE_READY] } });
		expect(retopic.body.events).toEqual([CAPTURE_READY, ORDER_STATUS]);
		const viaEventTypes = await stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice, body: { event_types: [CAPTURE_READY] } });
		expect(viaEventTypes.body.events).toEqual([CAPTURE_READY]);

		const disabled = await stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice, body: { active: false } });
		expect(disabled.body).toMatchObject({ active: false, disabled_reason: "user", disabled_at: disabled.body.updated_at });
		expect((await stack.request("GET", `/id/v3/webhooks/${webhook.id}`, { token: alice })).body).toEqual(disabled.body);
		// Switching it off again keeps the first reason and time.
		const again = await stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice, body: { active: false } });
		expect(again.body).toMatchObject({ active: false, disabled_reason: "user", disabled_at: disabled.body.disabled_at });
		const enabled = await stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token: alice, body: { active: true, name: "Back on" } });
		expect(enabled.body).toMatchObject({ active: true, disabled_reason: null, disabled_at: null, name: "Back on", events: [CAPTURE_READY], url: webhook.url });
		expect(enabled.text).not.toContain(webhook.secret);
	});

	it("keeps ordering: per_order by default, none on request, changed both ways with PATCH, in every answer and to the dispatcher", async () => {
		const customer = `ordering-${database}`;
		const token = await stack.token("olga", { customer });
		const stored = async (id: string) => (await stack.db("webhooks").where({ id }).first("ordering")).ordering;
		const subscriberOrdering = async (id: string) =>
			(await stack.app.broker.call<Array<{ id: string; ordering: string }>, object>("webhooks.subscribers", { customerId: customer, topic: ORDER_STATUS })).find(entry => entry.id === id)?.ordering;
		const resolvedOrdering = async (id: string) => (await stack.app.broker.call<Array<{ ordering: string }>, object>("webhooks.resolve", { ids: [id] }))[0].ordering;

		const byDefault = await newWebhook(token);
		expect(byDefault).toMatchObject({ ordering: "per_order" });
		expect(await stored(byDefault.id)).toBe("per_order");

		const unordered = await newWebhook(token, { ordering: "none" });
		expect(unordered).toMatchObject({ ordering: "none" });
		expect(await stored(unordered.id)).toBe("none");
		expect((await stack.request("GET", `/id/v3/webhooks/${unordered.id}`, { token })).body.ordering).toBe("none");
		const listed = (await stack.request("GET", "/id/v3/webhooks", { token })).body.webhooks as Array<{ id: string; ordering: string }>;
		expect(listed.map(({ id, ordering }) => ({ id, ordering }))).toEqual([
			{ id: byDefault.id, ordering: "per_order" },
			{ id: unordered.id, ordering: "none" },
		]);
		expect(await stack.app.broker.call("webhooks.find", { id: unordered.id }, { meta: { customerId: customer } })).toMatchObject({ ordering: "none" });
		expect((await stack.request("POST", `/id/v3/webhooks/${unordered.id}/rotate`, { token })).body.ordering).toBe("none");
		expect(await subscriberOrdering(unordered.id)).toBe("none");
		expect(await resolvedOrdering(unordered.id)).toBe("none");

		// Both ways with PATCH, alone or beside another field; the rest of the record stays.
		const toPerOrder = await stack.request("PATCH", `/id/v3/webhooks/${unordered.id}`, { token, body: { ordering: "per_order" } });
		expect(toPerOrder.status).toBe(200);
		expect(toPerOrder.body).toMatchObject({ ordering: "per_order", name: unordered.name, events: unordered.events, active: true });
		expect(await stored(unordered.id)).toBe("per_order");
		expect(await subscriberOrdering(unordered.id)).toBe("per_order");
		const toNone = await stack.request("PATCH", `/id/v3/webhooks/${byDefault.id}`, { token, body: { ordering: "none", name: "No order kept" } });
		expect(toNone.body).toMatchObject({ ordering: "none", name: "No order kept" });
		expect(await resolvedOrdering(byDefault.id)).toBe("none");
		// A PATCH without ordering leaves it as it is.
		expect((await stack.request("PATCH", `/id/v3/webhooks/${byDefault.id}`, { token, body: { active: false } })).body).toMatchObject({ ordering: "none", active: false });
		expect((await stack.request("PATCH", `/id/v3/webhooks/${byDefault.id}`, { token, body: { active: true } })).body).toMatchObject({ ordering: "none", active: true });

		// Every webhooks.updated carries the ordering after the change, the dispatcher's disable included.
		await stack.app.broker.call("webhooks.disable", { id: unordered.id, reason: "gone" });
		const updates = await waitFor(
			async () => events.filter(event => event.name === "webhooks.updated" && (event.payload.id === byDefault.id || event.payload.id === unordered.id)),
			found => found.length >= 5,
			"five webhooks.updated events",
		);
		expect(updates.map(event => event.payload)).toEqual([
			{ id: unordered.id, customerId: customer, active: true, ordering: "per_order", rateLimit: null },
			{ id: byDefault.id, customerId: customer, active: true, ordering: "none", rateLimit: null },
			{ id: byDefault.id, customerId: customer, active: false, ordering: "none", rateLimit: null },
			{ id: byDefault.id, customerId: customer, active: true, ordering: "none", rateLimit: null },
			{ id: unordered.id, customerId: customer, active: false, ordering: "per_order", rateLimit: null },
		]);
		const created = events.filter(event => event.name === "webhooks.created" && event.payload.id === unordered.id);
		expect(created.map(event => event.payload)).toEqual([{ id: unordered.id, customerId: customer, active: true, ordering: "none", rateLimit: null }]);
	});

	it("keeps rate_limit: none by default, a number on request, changed and cleared with PATCH, in every answer and to the dispatcher", async () => {
		const customer = `rate-limit-${database}`;
		const token = await stack.token("rita", { customer });
		const stored = async (id: string) => (await stack.db("webhooks").where({ id }).first("rate_limit")).rate_limit;
		const subscriberLimit = async (id: string) =>
			(await stack.app.broker.call<Array<{ id: string; rateLimit: number | null }>, object>("webhooks.subscribers", { customerId: customer, topic: ORDER_STATUS })).find(entry => entry.id === id)
				?.rateLimit;
		const resolvedLimit = async (id: string) => (await stack.app.broker.call<Array<{ rateLimit: number | null }>, object>("webhooks.resolve", { ids: [id] }))[0].rateLimit;

		const unlimited = await newWebhook(token);
		expect(unlimited).toMatchObject({ rate_limit: null });
		expect(await stored(unlimited.id)).toBeNull();
		expect(await subscriberLimit(unlimited.id)).toBeNull();
		// Sent as null on create: the same as leaving it out.
		const explicitlyUnlimited = await newWebhook(token, { rate_limit: null });
		expect(explicitlyUnlimited).toMatchObject({ rate_limit: null });

		// The bounds themselves are accepted.
		const limited = await newWebhook(token, { rate_limit: 1 });
		expect(limited).toMatchObject({ rate_limit: 1 });
		expect((await newWebhook(token, { rate_limit: 10_000 })).rate_limit).toBe(10_000);
		expect(await stored(limited.id)).toBe(1);
		expect((await stack.request("GET", `/id/v3/webhooks/${limited.id}`, { token })).body.rate_limit).toBe(1);
		const listed = (await stack.request("GET", "/id/v3/webhooks", { token })).body.webhooks as Array<{ id: string; rate_limit: number | null }>;
		expect(listed.map(({ id, rate_limit }) => ({ id, rate_limit })).slice(0, 3)).toEqual([
			{ id: unlimited.id, rate_limit: null },
			{ id: explicitlyUnlimited.id, rate_limit: null },
			{ id: limited.id, rate_limit: 1 },
		]);
		expect(await stack.app.broker.call("webhooks.find", { id: limited.id }, { meta: { customerId: customer } })).toMatchObject({ rate_limit: 1 });
		expect((await stack.request("POST", `/id/v3/webhooks/${limited.id}/rotate`, { token })).body.rate_limit).toBe(1);
		expect(await subscriberLimit(limited.id)).toBe(1);
		expect(await resolvedLimit(limited.id)).toBe(1);

		// PATCH sets, changes and clears it, alone or beside another field; the rest of the record stays.
		const raised = await stack.request("PATCH", `/id/v3/webhooks/${limited.id}`, { token, body: { rate_limit: 250 } });
		expect(raised.status).toBe(200);
		expect(raised.body).toMatchObject({ rate_limit: 250, name: limited.name, events: limited.events, active: true, ordering: "per_order" });
		expect(await stored(limited.id)).toBe(250);
		expect(await subscriberLimit(limited.id)).toBe(250);
		const set = await stack.request("PATCH", `/id/v3/webhooks/${unlimited.id}`, { token, body: { rate_limit: 5, ordering: "none" } });
		expect(set.body).toMatchObject({ rate_limit: 5, ordering: "none" });
		expect(await resolvedLimit(unlimited.id)).toBe(5);
		// A PATCH without rate_limit leaves it as it is.
		expect((await stack.request("PATCH", `/id/v3/webhooks/${unlimited.id}`, { token, body: { active: false } })).body).toMatchObject({ rate_limit: 5, active: false });
		expect((await stack.request("PATCH", `/id/v3/webhooks/${unlimited.id}`, { token, body: { active: true, name: "Five a second" } })).body).toMatchObject({ rate_limit: 5, active: true });
		// null clears it.
		const cleared = await stack.request("PATCH", `/id/v3/webhooks/${limited.id}`, { token, body: { rate_limit: null } });
		expect(cleared.status).toBe(200);
		expect(cleared.body).toMatchObject({ rate_limit: null, name: limited.name });
		expect(await stored(limited.id)).toBeNull();
		expect(await resolvedLimit(limited.id)).toBeNull();

		// Every webhooks.updated carries the limit after the change, the dispatcher's disable included.
		await stack.app.broker.call("webhooks.disable", { id: unlimited.id, reason: "failing" });
		const updates = await waitFor(
			async () => events.filter(event => event.name === "webhooks.updated" && (event.payload.id === limited.id || event.payload.id === unlimited.id)),
			found => found.length >= 6,
			"six webhooks.updated events",
		);
		expect(updates.map(event => event.payload)).toEqual([
			{ id: limited.id, customerId: customer, active: true, ordering: "per_order", rateLimit: 250 },
			{ id: unlimited.id, customerId: customer, active: true, ordering: "none", rateLimit: 5 },
			{ id: unlimited.id, customerId: customer, active: false, ordering: "none", rateLimit: 5 },
			{ id: unlimited.id, customerId: customer, active: true, ordering: "none", rateLimit: 5 },
			{ id: limited.id, customerId: customer, active: true, ordering: "per_order", rateLimit: null },
			{ id: unlimited.id, customerId: customer, active: false, ordering: "none", rateLimit: 5 },
		]);
		const created = events.filter(event => event.name === "webhooks.created" && (event.payload.id === limited.id || event.payload.id === unlimited.id));
		expect(created.map(event => event.payload)).toEqual([
			{ id: unlimited.id, customerId: customer, active: true, ordering: "per_order", rateLimit: null },
			{ id: limited.id, customerId: customer, active: true, ordering: "per_order", rateLimit: 1 },
		]);
	});

	it("deletes with 204 and no body; the webhook is gone afterwards", async () => {
		const webhook = await newWebhook(alice);
		const removed = await stack.request("DELETE", `/id/v3/webhooks/${webhook.id}`, { token: alice });
		expect(removed.status).toBe(204);
		expect(removed.text).toBe("");
		expectProblem(await stack.request("GET", `/id/v3/webhooks/${webhook.id}`, { token: alice }), 404);
		expectProblem(await stack.request("DELETE", `/id/v3/webhooks/${webhook.id}`, { token: alice }), 404);
		const list = await stack.request("GET", "/id/v3/webhooks?per_page=100", { token: alice });
		expect(list.body.webhooks.map((entry: { id: string }) => entry.id)).not.toContain(webhook.id);
	});

	it("rotates the secret: a new one is returned once, the record is otherwise unchanged", async () => {
		const webhook = await newWebhook(alice);
		const rotated = await stack.request("POST", `/id/v3/webhooks/${webhook.id}/rotate`, { token: alice });
		expect(rotated.status).toBe(200);
		expect(rotated.body).toEqual({ ...webhook, secret: expect.stringMatching(SECRET_FORM), updated_at: expect.stringMatching(ISO_TIME) });
		expect(rotated.body.secret).not.toBe(webhook.secret);
		const again = await stack.request("POST", `/id/v3/webhooks/${webhook.id}/rotate`, { token: alice });
		expect(new Set([webhook.secret, rotated.body.secret, again.body.secret]).size).toBe(3);
		expect((await stack.request("GET", `/id/v3/webhooks/${webhook.id}`, { token: alice })).text).not.toContain(again.body.secret);
	});

	it("keeps customers apart: the customer is the token's customer claim, or the user's own", async () => {
		const acmeHook = await newWebhook(bob);
		// carol works for acme too, so she manages bob's webhook.
		expect((await stack.request("GET", `/id/v3/webhooks/${acmeHook.id}`, { token: carol })).status).toBe(200);
		const carolsList = await stack.request("GET", "/id/v3/webhooks?per_page=100", { token: carol });
		expect(carolsList.body.webhooks.map((entry: { id: string }) => entry.id)).toContain(acmeHook.id);

		// A user named "acme" without a customer claim is their own customer, not the customer "acme".
		const acmeUser = await stack.token("acme");
		expectProblem(await stack.request("GET", `/id/v3/webhooks/${acmeHook.id}`, { token: acmeUser }), 404);

		// alice is another customer: everything about acme's webhook is a 404, and it never lists.
		const before = await stack.db("webhooks").where({ id: acmeHook.id }).first();
		expectProblem(await stack.request("GET", `/id/v3/webhooks/${acmeHook.id}`, { token: alice }), 404);
		expectProblem(await stack.request("PATCH", `/id/v3/webhooks/${acmeHook.id}`, { token: alice, body: { active: false } }), 404);
		expectProblem(await stack.request("POST", `/id/v3/webhooks/${acmeHook.id}/rotate`, { token: alice }), 404);
		expectProblem(await stack.request("DELETE", `/id/v3/webhooks/${acmeHook.id}`, { token: alice }), 404);
		const alicesList = await stack.request("GET", "/id/v3/webhooks?per_page=100", { token: alice });
		expect(alicesList.body.webhooks.map((entry: { id: string }) => entry.id)).not.toContain(acmeHook.id);
		expect(await stack.db("webhooks").where({ id: acmeHook.id }).first()).toEqual(before);

		// The answer for someone else's id is the same as for an id that never existed.
		const foreign = await stack.request("GET", `/id/v3/webhooks/${acmeHook.id}`, { token: alice });
		const missing = await stack.request("GET", `/id/v3/webhooks/${crypto.randomUUID()}`, { token: alice });
		expect(foreign.body).toEqual(missing.body);
	});

	it("finds a webhook for other services only within the caller's customer", async () => {
		const webhook = await newWebhook(alice);
		const found = await stack.app.broker.call("webhooks.find", { id: webhook.id }, { meta: { customerId: "~alice" } });
		expect(found).toEqual({ ...webhook, secret: undefined });
		expect(found).not.toHaveProperty("secret");
		await expect(stack.app.broker.call("webhooks.find", { id: webhook.id }, { meta: { customerId: "acme" } })).rejects.toMatchObject({ code: 404 });
	});

	it("gives the dispatcher the active subscribers of a topic, with their secrets newest first", async () => {
		const customer = `subscribers-${database}`;
		const token = await stack.token("sam", { customer });
		const orders = await newWebhook(token, { events: [ORDER_STATUS] });
		const both = await newWebhook(token, { events: [ORDER_STATUS, CAPTURE_READY] });
		const captures = await newWebhook(token, { events: [CAPTURE_READY] });
		const paused = await newWebhook(token, { events: [ORDER_STATUS] });
		await stack.request("PATCH", `/id/v3/webhooks/${paused.id}`, { token, body: { active: false } });
		// Another customer's webhook on the same topic is never included.
		await newWebhook(alice, { events: [ORDER_STATUS] });

		const subscribers = (topic: string) =>
			stack.app.broker.call<Array<{ id: string; customerId: string; url: string; secrets: string[] }>, object>("webhooks.subscribers", { customerId: customer, topic });
		const byId = <T extends { id: string }>(list: T[]) => [...list].sort((a, b) => a.id.localeCompare(b.id));

		expect(byId(await subscribers(ORDER_STATUS))).toEqual(
			byId([
				{ id: orders.id, customerId: customer, url: orders.url, secrets: [orders.secret], previousSecretExpiresAt: null, headers: {}, ordering: "per_order", rateLimit: null },
				{ id: both.id, customerId: customer, url: both.url, secrets: [both.secret], previousSecretExpiresAt: null, headers: {}, ordering: "per_order", rateLimit: null },
			]),
		);
		expect(byId(await subscribers(CAPTURE_READY))).toEqual(
			byId([
				{ id: both.id, customerId: customer, url: both.url, secrets: [both.secret], previousSecretExpiresAt: null, headers: {}, ordering: "per_order", rateLimit: null },
				{ id: captures.id, customerId: customer, url: captures.url, secrets: [captures.secret], previousSecretExpiresAt: null, headers: {}, ordering: "per_order", rateLimit: null },
			]),
		);
		expect(await subscribers("imaging:unknown_topic")).toEqual([]);

		// During the rotation grace period (24 h by default) the old secret still signs, and the
		// dispatcher is told when it stops, so that it keeps neither past then.
		const rotatedAt = Date.now();
		const rotated = await stack.request("POST", `/id/v3/webhooks/${orders.id}/rotate`, { token });
		const afterRotation = (await subscribers(ORDER_STATUS)).find(entry => entry.id === orders.id) as { secrets: string[]; previousSecretExpiresAt: string } | undefined;
		expect(afterRotation?.secrets).toEqual([rotated.body.secret, orders.secret]);
		const graceEnds = Date.parse(afterRotation!.previousSecretExpiresAt);
		expect(graceEnds).toBeGreaterThanOrEqual(rotatedAt + 24 * 3_600_000 - 1_000);
		expect(graceEnds).toBeLessThanOrEqual(Date.now() + 24 * 3_600_000);

		// Re-enabling brings a paused webhook back.
		await stack.request("PATCH", `/id/v3/webhooks/${paused.id}`, { token, body: { active: true } });
		expect((await subscribers(ORDER_STATUS)).map(entry => entry.id)).toContain(paused.id);
	});

	it("resolves ids to the webhooks that still exist, active or not", async () => {
		const customer = `resolve-${database}`;
		const token = await stack.token("rita", { customer });
		const active = await newWebhook(token);
		const inactive = await newWebhook(token);
		const deleted = await newWebhook(token);
		await stack.request("PATCH", `/id/v3/webhooks/${inactive.id}`, { token, body: { active: false } });
		await stack.request("DELETE", `/id/v3/webhooks/${deleted.id}`, { token });

		const resolved = await stack.app.broker.call<Array<{ id: string }>, object>("webhooks.resolve", {
			ids: [active.id, inactive.id, deleted.id, crypto.randomUUID(), active.id.toUpperCase()],
		});
		expect([...resolved].sort((a, b) => a.id.localeCompare(b.id))).toEqual(
			[
				{ id: active.id, customerId: customer, url: active.url, active: true, secrets: [active.secret], previousSecretExpiresAt: null, headers: {}, ordering: "per_order", rateLimit: null },
				{ id: inactive.id, customerId: customer, url: inactive.url, active: false, secrets: [inactive.secret], previousSecretExpiresAt: null, headers: {}, ordering: "per_order", rateLimit: null },
			].sort((a, b) => a.id.localeCompare(b.id)),
		);
		expect(await stack.app.broker.call("webhooks.resolve", { ids: [] })).toEqual([]);
	});

	it("announces created, updated, rotated and removed webhooks on the broker", async () => {
		const customer = `events-${database}`;
		const token = await stack.token("eve", { customer });
		const webhook = await newWebhook(token);
		await stack.request("PATCH", `/id/v3/webhooks/${webhook.id}`, { token, body: { active: false } });
		await stack.request("POST", `/id/v3/webhooks/${webhook.id}/rotate`, { token });
		await stack.request("DELETE", `/id/v3/webhooks/${webhook.id}`, { token });

		const mine = await waitFor(
			async () => events.filter(event => event.payload.id === webhook.id),
			found => found.length >= 4,
			"four webhook events",
		);
		expect(mine).toEqual([
			{ name: "webhooks.created", payload: { id: webhook.id, customerId: customer, active: true, ordering: "per_order", rateLimit: null } },
			{ name: "webhooks.updated", payload: { id: webhook.id, customerId: customer, active: false, ordering: "per_order", rateLimit: null } },
			{ name: "webhooks.rotated", payload: { id: webhook.id, customerId: customer } },
			{ name: "webhooks.removed", payload: { id: webhook.id, customerId: customer } },
		]);
		for (const event of mine) expect(JSON.stringify(event)).not.toContain("whsec_");
	});
});

describe.each(testDatabases())("webhooks with a short rotation grace and loopback receivers allowed, on %s", database => {
	let stack: Stack;
	let token: string;

	beforeAll(async () => {
		stack = await startStack({
			services: [...SERVICES],
			database,
			env: { SECRET_ROTATION_GRACE: "1s", WEBHOOK_ALLOW_NETS: "127.0.0.0/8,::1/128" },
		});
		token = await stack.token("lola");
	});
	afterAll(() => stack?.stop());

	it("drops the previous secret once the grace period is over", async () => {
		const created = await stack.request("POST", "/id/v3/webhooks", {
			token,
			body: { name: "grace", url: "https://127.0.0.1:8443/hook", events: [ORDER_STATUS] },
		});
		expect(created.status).toBe(201);
		const rotated = await stack.request("POST", `/id/v3/webhooks/${created.body.id}/rotate`, { token });
		expect(rotated.status).toBe(200);

		const secretsNow = async () => {
			const [subscriber] = await stack.app.broker.call<Array<{ secrets: string[] }>, object>("webhooks.subscribers", { customerId: "~lola", topic: ORDER_STATUS });
			return subscriber.secrets;
		};
		const settled = await waitFor(secretsNow, secrets => secrets.length === 1, "the previous secret to expire");
		expect(settled).toEqual([rotated.body.secret]);
		const [resolved] = await stack.app.broker.call<Array<{ secrets: string[] }>, object>("webhooks.resolve", { ids: [created.body.id] });
		expect(resolved.secrets).toEqual([rotated.body.secret]);
	});

	it("accepts loopback receivers, by address or as localhost, when configuration allows loopback", async () => {
		for (const url of ["https://127.0.0.1:9443/", "https://[::1]:9443/", "https://localhost:9443/", "https://receiver.localhost/"]) {
			const response = await stack.request("POST", "/id/v3/webhooks", { token, body: { name: `local ${url}`, url, events: [ORDER_STATUS] } });
			expect({ url, status: response.status }).toEqual({ url, status: 201 });
		}
		// Loopback only: private ranges stay blocked.
		expectProblem(await stack.request("POST", "/id/v3/webhooks", { token, body: { name: "private", url: "https://10.0.0.1/", events: [ORDER_STATUS] } }), 422);
	});
});

describe.each(testDatabases())("webhooks stored before ordering and rate_limit existed, on %s", database => {
	let db: Knex;
	let stack: Stack | undefined;
	let scratch: ScratchDatabase | undefined;

	beforeAll(async () => {
		scratch = await scratchDatabase(database, "ordering");
		db = scratch.db;
	});
	afterAll(async () => {
		await stack?.stop();
		await scratch?.drop();
	});

	it("get per_order and no rate limit, the defaults, and keep them through the API and to the dispatcher", async () => {
		await runMigrations(db, "webhooks", webhooksMigrations.filter(migration => migration.name < "007"));
		const id = crypto.randomUUID();
		const at = "2026-01-01T00:00:00.000Z";
		await db("webhooks").insert({ id, customer_id: "acme", name: "Before ordering", url: "https://before.example.com/in", events: JSON.stringify([ORDER_STATUS]), active: true, secret_envelope: "x", created_at: at, updated_at: at });

		stack = await startStack({ database, dataDir: scratch!.dataDir, schema: scratch!.schema, services: [...SERVICES] });
		expect(await db("webhooks").where({ id }).first("ordering")).toEqual({ ordering: "per_order" });
		const token = await stack.token("bob", { customer: "acme" });
		// Nor had it a rate limit: none, as a new webhook.
		expect((await stack.request("GET", `/id/v3/webhooks/${id}`, { token })).body).toMatchObject({ id, name: "Before ordering", ordering: "per_order", rate_limit: null });
		// The secret sealed under this stack's key, as the service would have sealed it.
		await db("webhooks").where({ id }).update({ secret_envelope: encryptSecret(generateWebhookSecret(), stack.config.SECRETS_KEY!, id) });
		expect((await stack.app.broker.call<Array<{ ordering: string }>, object>("webhooks.resolve", { ids: [id] }))[0]).toMatchObject({ ordering: "per_order", rateLimit: null });
		// A row written without the column (another tool, an older node) gets the default too.
		const later = crypto.randomUUID();
		await db("webhooks").insert({ id: later, customer_id: "acme", name: "Written elsewhere", url: "https://elsewhere.example.com/in", events: JSON.stringify([ORDER_STATUS]), active: true, secret_envelope: "x", created_at: at, updated_at: at });
		expect((await stack.request("GET", `/id/v3/webhooks/${later}`, { token })).body).toMatchObject({ ordering: "per_order", rate_limit: null });
	});
});
