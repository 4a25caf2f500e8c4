/// <reference lib="dom" />
// The web application in a real browser (Debian's Chromium through playwright-core) against the
// real gateway, real database and a real HTTPS receiver: sign in with a token, create a webhook
// (ordering none, a rate limit) and see its secret once, test it (passing and failing), rotate,
// pause and resume deliveries, read the delivery log and retry a failed delivery, rename and change
// events and ordering, clear the rate limit, turn email on and off (and meet a 412), delete. Every page is checked with axe-core
// and photographed at desktop and phone width into docs/screenshots/.
import crypto from "node:crypto";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { startDeliveryStack, verified, waitUntil, type DeliveryStack } from "./helpers/delivery-stack";
import { describeBrowserSuite, launchChromium, screenshotBothWidths, seriousViolations, VIEWPORTS } from "./helpers/browser";

const describeWithBrowser = describeBrowserSuite();

describeWithBrowser("web application in Chromium", () => {
	let env: DeliveryStack;
	let browser: Browser;
	let context: BrowserContext;
	let page: Page;
	let token: string;
	const customer = `acme-${crypto.randomBytes(3).toString("hex")}`;
	const user = `alice-${customer}`;
	const api = (method: string, path: string, body?: unknown, headers?: Record<string, string>) => env.stack.request(method, `/id/v3${path}`, { token, body, headers });
	const receiverPath = (name: string) => `/hooks/web-${name}`;
	let webhookId = "";
	let secret = "";

	const expectAccessible = async (what: string) => {
		const violations = await seriousViolations(page);
		if (violations.length) console.log(`axe on ${what}:`, JSON.stringify(violations, null, 2));
		expect(violations).toEqual([]);
	};
	/** Readable on a phone: nothing wider than the screen, so no sideways scrolling. */
	const expectNoSidewaysScroll = async () => {
		await page.setViewportSize(VIEWPORTS.phone);
		const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
		await page.setViewportSize(VIEWPORTS.desktop);
		expect(overflow).toBeLessThanOrEqual(0);
	};

	beforeAll(async () => {
		// One retry one second after the first attempt, so a failing delivery is `failed` quickly.
		env = await startDeliveryStack("sqlite", { env: { DELIVERY_RETRY_SCHEDULE: "1s", WEBHOOK_TEST_TIMEOUT: "3s" } });
		token = await env.stack.token(user, { customer, email: "alice@example.com", name: "Alice" });
		browser = await launchChromium();
		context = await browser.newContext({ viewport: VIEWPORTS.desktop, locale: "en-GB", timezoneId: "UTC", reducedMotion: "reduce" });
		await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: env.stack.baseUrl });
		page = await context.newPage();
		page.on("pageerror", error => console.error("page error:", error));
	});
	afterAll(async () => {
		await browser?.close();
		await env?.stop();
	});

	it("shows the sign-in screen with the command that mints a token, and signs in with one", async () => {
		await page.goto(env.stack.baseUrl + "/");
		await page.getByRole("heading", { name: "Sign in" }).waitFor();
		expect(await page.locator("pre.command").textContent()).toMatch(/^npm run -s token -- --sub /);
		await expectAccessible("sign-in");
		await screenshotBothWidths(page, "sign-in");
		await expectNoSidewaysScroll();

		// Something that is not a token is refused before any request.
		await page.getByLabel("Access token").fill("not a token");
		await page.getByRole("button", { name: "Sign in" }).click();
		await page.getByText("This is not a token").waitFor();
		expect(await page.getByLabel("Access token").getAttribute("aria-invalid")).toBe("true");

		// What npm prints around the token when the command is run without -s is left out.
		await page.getByLabel("Access token").fill(`\n> satellite-webhooks@0.1.0 token\n> tsx scripts/token.ts --sub ${user}\n\n${token}\n`);
		await page.getByRole("button", { name: "Sign in" }).click();
		await page.getByRole("heading", { name: "Webhooks", level: 1 }).waitFor();
		expect(new URL(page.url()).pathname).toBe("/webhooks");
		// The empty state explains what a webhook is, next to the create form.
		await page.getByRole("heading", { name: "No webhooks yet" }).waitFor();
		expect(await page.locator(".empty").textContent()).toContain("sends an HTTPS request to a URL of yours");
		await expectAccessible("webhooks, empty");
		await screenshotBothWidths(page, "webhooks-empty");
	});

	it("keeps only the token, in session storage", async () => {
		const storage = await page.evaluate(() => ({ session: Object.keys(sessionStorage), local: Object.keys(localStorage), cookies: document.cookie }));
		expect(storage).toEqual({ session: ["satellite-webhooks.token"], local: [], cookies: "" });
		expect(await page.evaluate(() => sessionStorage.getItem("satellite-webhooks.token"))).toBe(token);
	});

	it("puts each API error next to the field it names", async () => {
		await page.getByLabel("Webhook Name").fill("Orders to ERP");
		await page.getByLabel("URL").fill("http://127.0.0.1/plain-http");
		await page.getByRole("button", { name: "Create webhook" }).click();
		const urlError = page.locator("#create-url-error");
		await urlError.waitFor();
		expect(await urlError.textContent()).toMatch(/HTTP is not supported/);
		expect(await page.getByLabel("URL").getAttribute("aria-invalid")).toBe("true");
		expect(await page.getByLabel("URL").getAttribute("aria-describedby")).toContain("create-url-error");
		// The problem's detail is announced at the top as well.
		expect(await page.getByRole("alert").first().textContent()).toMatch(/Unprocessable Content/);
		// No event type: the message lands under "Event Types".
		await page.getByLabel("URL").fill(`${env.receiver.url}${receiverPath("erp")}`);
		await page.getByRole("group", { name: "Event Types" }).getByRole("checkbox").first().uncheck();
		await page.getByRole("button", { name: "Create webhook" }).click();
		await page.locator("#create-events-error").waitFor();
		expect(await page.locator("#create-events-error").textContent()).toMatch(/at least one event topic/);
		expect(await api("GET", "/webhooks").then(response => response.body.webhooks)).toEqual([]);
	});

	it("creates a webhook from the form labelled Webhook Name, URL, Event Types, Ordering and Rate limit, and shows the secret once", async () => {
		await page.getByRole("group", { name: "Event Types" }).getByRole("checkbox", { name: "Tasking order status updates" }).check();
		// Ordering starts at its default, explained in one line; this webhook opts out.
		const ordering = page.getByRole("group", { name: "Ordering" });
		expect(await ordering.getByRole("radio", { name: "Per order (default)" }).isChecked()).toBe(true);
		expect(await ordering.getByRole("radio", { name: "None" }).isChecked()).toBe(false);
		const perOrderLine = await ordering.getByRole("radio", { name: "Per order (default)" }).getAttribute("aria-describedby");
		expect(await page.locator(`#${perOrderLine}`).textContent()).toMatch(/one at a time, in the order they happened.*holds back only itself/);
		await ordering.getByRole("radio", { name: "None" }).check();
		// Rate limit starts empty (no limit), explained in one line; this webhook gets one.
		const rateLimit = page.getByLabel("Rate limit");
		expect(await rateLimit.inputValue()).toBe("");
		const rateLimitLine = await rateLimit.getAttribute("aria-describedby");
		expect(await page.locator(`#${rateLimitLine}`).textContent()).toMatch(/deliveries per second.*empty for no limit.*wait their turn, they never fail/);
		await rateLimit.fill("25");
		await page.getByRole("button", { name: "Create webhook" }).click();
		const panel = page.locator(".secret-panel");
		await panel.waitFor();
		expect(await panel.textContent()).toContain("Copy this secret now. It cannot be shown again.");
		secret = await page.getByLabel("Secret", { exact: true }).inputValue();
		expect(secret).toMatch(/^whsec_[A-Za-z0-9+/=]+$/);
		await page.getByRole("button", { name: "Copy secret" }).click();
		await page.getByText("Copied to the clipboard.").waitFor();
		// Its label stays on one line, beside the secret on a desktop and under it on a phone.
		const copyLabelLines = () =>
			page.getByRole("button", { name: "Copy secret" }).evaluate(button => {
				const range = document.createRange();
				range.selectNodeContents(button);
				return new Set(Array.from(range.getClientRects(), rect => Math.round(rect.top))).size;
			});
		expect(await copyLabelLines()).toBe(1);
		await page.setViewportSize(VIEWPORTS.phone);
		expect(await copyLabelLines()).toBe(1);
		await page.setViewportSize(VIEWPORTS.desktop);
		expect(await page.evaluate(() => navigator.clipboard.readText())).toBe(secret);
		await expectAccessible("secret shown after create");
		await screenshotBothWidths(page, "webhook-created");

		const [created] = (await api("GET", "/webhooks")).body.webhooks;
		expect(created).toMatchObject({ name: "Orders to ERP", url: `${env.receiver.url}${receiverPath("erp")}`, events: ["tasking:order_status"], active: true, ordering: "none", rate_limit: 25 });
		webhookId = created.id;

		await page.getByRole("button", { name: "I have stored the secret" }).click();
		await page.reload();
		await page.getByRole("link", { name: "Orders to ERP" }).waitFor();
		expect(await page.content()).not.toContain(secret);
		await expectAccessible("webhooks list");
		await screenshotBothWidths(page, "webhooks");
		await expectNoSidewaysScroll();
	});

	it("tests the webhook: success, then a failure showing the status code", async () => {
		await page.getByRole("link", { name: "Orders to ERP" }).click();
		await page.getByRole("heading", { name: "Orders to ERP", level: 1 }).waitFor();
		await page.getByRole("button", { name: "Send test event" }).click();
		await page.getByText("Test passed").waitFor();
		const [testRequest] = env.receiver.requests.filter(request => request.path === receiverPath("erp"));
		expect(verified(testRequest, secret)).toMatchObject({ type: "webhook:test" });

		env.receiver.respondWith({ status: 503, body: "receiver internals" });
		await page.getByRole("button", { name: "Send test event" }).click();
		const failure = page.locator(".test-result");
		await failure.getByText("Test failed").waitFor();
		expect(await failure.textContent()).toMatch(/Test failed: 503 HTTP Status Error\. .*503/);
		expect(await failure.textContent()).not.toContain("receiver internals");
	});

	it("rotates the secret after a confirmation, and shows the new one once", async () => {
		await page.getByRole("button", { name: "Rotate secret" }).click();
		const dialog = page.getByRole("dialog", { name: "Rotate the signing secret?" });
		await dialog.waitFor();
		await expectAccessible("rotate confirmation");
		// Cancelling changes nothing.
		await dialog.getByRole("button", { name: "Cancel" }).click();
		await dialog.waitFor({ state: "hidden" });
		await page.getByRole("button", { name: "Rotate secret" }).click();
		await dialog.getByRole("button", { name: "Rotate secret" }).click();
		await page.getByRole("heading", { name: /New signing secret/ }).waitFor();
		const rotated = await page.getByLabel("Secret", { exact: true }).inputValue();
		expect(rotated).toMatch(/^whsec_/);
		expect(rotated).not.toBe(secret);
		expect(await page.locator(".secret-panel").textContent()).toContain("It cannot be shown again.");
		secret = rotated;
		await page.getByRole("button", { name: "I have stored the secret" }).click();
		await page.locator(".secret-panel").waitFor({ state: "detached" });
	});

	it("pauses deliveries with the status switch and resumes them", async () => {
		const toggle = page.getByRole("switch", { name: "Deliveries to Orders to ERP" });
		expect(await toggle.getAttribute("aria-checked")).toBe("true");
		await toggle.click();
		await page.waitForFunction(() => document.querySelector('[role="switch"]')?.getAttribute("aria-checked") === "false");
		expect((await api("GET", `/webhooks/${webhookId}`)).body).toMatchObject({ active: false, disabled_reason: "user" });
		// The page says why and since when.
		expect(await page.locator(".disabled-note").innerText()).toMatch(/^Disabled by a user \(since .+\)\. Enable it to resume its paused deliveries\.$/);

		// While disabled, an event makes no delivery and nothing reaches the receiver.
		const before = env.receiver.requests.length;
		const paused = { event_id: crypto.randomUUID(), customer_id: customer, user_id: user, order_id: "o-paused", status: "fulfilled" };
		expect(await env.stack.app.broker.call("dispatcher.publish", paused)).toMatchObject({ deliveries: 0 });
		expect(await env.stack.db("deliveries").where({ event_id: paused.event_id })).toEqual([]);
		expect(env.receiver.requests.length).toBe(before);

		await toggle.click();
		await page.waitForFunction(() => document.querySelector('[role="switch"]')?.getAttribute("aria-checked") === "true");
		expect((await api("GET", `/webhooks/${webhookId}`)).body).toMatchObject({ active: true, disabled_reason: null });
		expect(await page.locator(".disabled-note").count()).toBe(0);
		const resumed = { event_id: crypto.randomUUID(), customer_id: customer, user_id: user, order_id: "o-resumed", status: "fulfilled" };
		expect(await env.stack.app.broker.call("dispatcher.publish", resumed)).toMatchObject({ deliveries: 1 });
		const [arrived] = await env.receiver.waitFor(request => request.path === receiverPath("erp") && request.body.includes("o-resumed"));
		expect(verified(arrived, secret)).toMatchObject({ type: "tasking:order_status", data: { order_id: "o-resumed" } });
		expect(env.receiver.requests.some(request => request.body.includes("o-paused"))).toBe(false);
	});

	it("shows the delivery log with each attempt, and retries a failed delivery", async () => {
		env.receiver.respondWith({ status: 500 }, { status: 500 });
		const event = { event_id: crypto.randomUUID(), customer_id: customer, user_id: user, order_id: "o-failing", status: "failed" };
		await env.stack.app.broker.call("dispatcher.publish", event);
		await waitUntil(() => env.stack.db("deliveries").where({ event_id: event.event_id }).first(), row => row?.status === "failed", "the delivery to fail twice");

		await page.getByRole("button", { name: "Refresh" }).click();
		const failedRow = page.locator("li.delivery.status-failed");
		await failedRow.waitFor();
		await failedRow.getByRole("button", { name: "Attempts" }).click();
		const attempts = failedRow.locator("table.attempts tbody tr");
		await attempts.nth(1).waitFor();
		expect(await attempts.count()).toBe(2);
		const cells = await attempts.first().locator("td").allTextContents();
		expect(cells[0]).toBe("1");
		expect(cells[2]).toBe("500");
		expect(cells[3]).toMatch(/^\d+ ms$/);
		expect(cells[4]).toBe("HTTP status");
		await page.locator("figure.chart").getByText("Failed: 1").waitFor({ timeout: 5_000 }).catch(async () => {
			await page.getByRole("button", { name: "Refresh" }).click();
			await page.locator("figure.chart").getByText("Failed: 1").waitFor();
		});
		await expectAccessible("webhook detail with delivery log");
		await screenshotBothWidths(page, "webhook-detail");
		await expectNoSidewaysScroll();

		const count = env.receiver.requests.filter(request => request.body.includes("o-failing")).length;
		await failedRow.getByRole("button", { name: /^Retry delivery/ }).click();
		await env.receiver.waitFor(request => request.body.includes("o-failing") && env.receiver.requests.filter(r => r.body.includes("o-failing")).length > count);
		await waitUntil(() => env.stack.db("deliveries").where({ event_id: event.event_id }).first(), row => row.status === "succeeded", "the retried delivery to succeed");
		await page.getByRole("button", { name: "Refresh" }).click();
		await page.locator("li.delivery.status-succeeded").filter({ hasText: "3 attempts" }).waitFor();
	});

	it("draws the 24-hour health chart from the stats endpoint", async () => {
		const stats = (await api("GET", `/webhooks/${webhookId}/stats?window=24h`)).body;
		const legend = await page.locator("figure.chart .legend").textContent();
		expect(legend).toContain(`Succeeded: ${stats.totals.succeeded}`);
		expect(await page.locator("figure.chart svg rect").count()).toBeGreaterThan(0);
		expect(await page.locator("figure.chart svg").getAttribute("aria-label")).toMatch(/^Last 24 hours: \d+ succeeded/);

		// One way of writing dates (the context's en-GB): the axis starts with a date and an hour,
		// and the Created date reads like the delivery log's times.
		expect(await page.locator("figure.chart .ticks span").first().textContent()).toMatch(/^\d{1,2} [A-Z][a-z]{2}, \d{2}:\d{2}$/);
		const fullDate = /^\d{1,2} [A-Z][a-z]{2} \d{4}, \d{2}:\d{2}:\d{2}$/;
		expect(await page.locator(".details dd").nth(1).textContent()).toMatch(fullDate);
		expect(await page.locator("li.delivery .delivery-row > span").nth(2).first().textContent()).toMatch(fullDate);

		// The figures per hour, every column readable at phone width without sideways scrolling.
		await page.getByText("Show the figures per hour").click();
		const firstHour = page.locator("table.per-hour tbody tr").first();
		await firstHour.waitFor();
		expect(await firstHour.locator("th").textContent()).toMatch(/^\d{1,2} [A-Z][a-z]{2}, \d{2}:\d{2}$/);
		await page.setViewportSize(VIEWPORTS.phone);
		const hidden = await page.locator("figure.chart .table-wrap").evaluate(wrap => {
			const edge = wrap.getBoundingClientRect().right;
			return Array.from(wrap.querySelectorAll("tbody td")).filter(cell => cell.getBoundingClientRect().right > edge + 0.5).length + (wrap.scrollWidth - wrap.clientWidth > 0 ? 1000 : 0);
		});
		await page.setViewportSize(VIEWPORTS.desktop);
		expect(hidden).toBe(0);
		await page.locator("figure.chart details").scrollIntoViewIfNeeded();
		await screenshotBothWidths(page, "webhook-stats");
		await expectAccessible("the figures per hour");
		await page.getByText("Show the figures per hour").click();
	});

	it("renames the webhook, changes its events and its ordering back to per order, clears its rate limit; a taken name and a bad limit are reported next to their fields", async () => {
		await env.stack.app.broker.call("topics.register", { topic: "tasking:order_created", category: "tasking", name: "Tasking order created", description: "A new tasking order was placed", webhooks: true, email: false });
		await api("POST", "/webhooks", { name: "Archive", url: `${env.receiver.url}${receiverPath("archive")}`, events: ["tasking:order_status"] });
		await page.reload();
		expect(await page.locator(".details").innerText()).toMatch(/Ordering\s+None\s+Rate limit\s+25 per second/);
		await page.getByRole("button", { name: "Edit webhook" }).click();
		// The edit form starts from the stored ordering and rate limit.
		const ordering = page.getByRole("group", { name: "Ordering" });
		expect(await ordering.getByRole("radio", { name: "None" }).isChecked()).toBe(true);
		const rateLimit = page.getByLabel("Rate limit");
		expect(await rateLimit.inputValue()).toBe("25");
		await expectAccessible("edit form");
		await page.getByLabel("Webhook Name").fill("Archive");
		await page.getByRole("button", { name: "Save changes" }).click();
		await page.locator("#edit-name-error").waitFor();
		expect(await page.locator("#edit-name-error").textContent()).toMatch(/already has this name/);

		// A limit the service does not take is explained under Rate limit, and changes nothing.
		await page.getByLabel("Webhook Name").fill("Orders to ERP (renamed)");
		await rateLimit.fill("2.5");
		await page.getByRole("button", { name: "Save changes" }).click();
		await page.locator("#edit-rate_limit-error").waitFor();
		expect(await page.locator("#edit-rate_limit-error").textContent()).toMatch(/whole number of deliveries per second from 1 to 10000/);
		expect(await rateLimit.getAttribute("aria-invalid")).toBe("true");
		expect(await rateLimit.getAttribute("aria-describedby")).toContain("edit-rate_limit-error");
		await page.waitForFunction(() => document.activeElement?.id === "edit-rate_limit");
		await expectAccessible("edit form with a rate limit problem");
		expect((await api("GET", `/webhooks/${webhookId}`)).body).toMatchObject({ name: "Orders to ERP", rate_limit: 25 });
		// Emptied, the box means no limit.
		await rateLimit.fill("");

		await page.getByLabel("Webhook Name").fill("Orders to ERP (renamed)");
		await page.getByRole("checkbox", { name: "Tasking order created" }).check();
		await ordering.getByRole("radio", { name: "Per order (default)" }).check();
		await page.getByRole("button", { name: "Save changes" }).click();
		await page.getByRole("heading", { name: "Orders to ERP (renamed)", level: 1 }).waitFor();
		expect((await api("GET", `/webhooks/${webhookId}`)).body).toMatchObject({ name: "Orders to ERP (renamed)", events: ["tasking:order_status", "tasking:order_created"], ordering: "per_order", rate_limit: null });
		expect(await page.locator(".details").innerText()).toMatch(/Ordering\s+Per order \(default\)\s+Rate limit\s+No limit/);
	});

	it("shows a delivery waiting for the earlier status of its order, linked to it, then both in order", async () => {
		const toErp = (request: { path: string; body: string }, status: string) => request.path === receiverPath("erp") && request.body.includes("o-queued") && request.body.includes(`"${status}"`);
		// The ERP webhook's first attempt of the first status is held by the receiver, so the second
		// status waits behind it. Only that request: the customer's other webhook gets the same
		// statuses, and a queued answer would go to whichever request came first (when it was the
		// other webhook's, the ERP head ended at once and the wait was over before the page looked).
		let held = false;
		env.receiver.setDefault(request => {
			if (held || !toErp(request, "staged")) return { status: 200, body: "ok" };
			held = true;
			return { status: 200, delayMs: 8_000 };
		});
		const status = (name: string, at: string) => ({ event_id: crypto.randomUUID(), customer_id: customer, user_id: user, order_id: "o-queued", status: name, occurred_at: at });
		const staged = status("staged", "2026-11-21T10:00:00.000Z");
		const inProgress = status("in progress", "2026-11-21T10:05:00.000Z");
		await env.stack.app.broker.call("dispatcher.publish", staged);
		await env.receiver.waitFor(request => toErp(request, "staged"));
		await env.stack.app.broker.call("dispatcher.publish", inProgress);
		const head = await env.stack.db("deliveries").where({ event_id: staged.event_id, webhook_id: webhookId }).first();
		const waiting = await waitUntil(
			() => api("GET", `/webhooks/${webhookId}/deliveries?status=pending`),
			answer => (answer.body as { deliveries: Array<{ waiting_for: string | null }> }).deliveries.some(delivery => delivery.waiting_for === head.id),
			"the later status to wait",
		);
		expect((waiting.body as { deliveries: unknown[] }).deliveries).toContainEqual(expect.objectContaining({ status: "pending", next_attempt_at: null, waiting_for: head.id }));

		await page.getByRole("button", { name: "Refresh" }).click();
		const link = page.getByRole("link", { name: "waiting for the earlier status" });
		await link.waitFor();
		await expectAccessible("delivery log with a waiting delivery");
		await screenshotBothWidths(page, "delivery-log-waiting");
		await link.click();
		// Focus moves once the earlier delivery's attempts are fetched: wait for that, not for its row
		// (already on the page, so waiting for it raced the fetch).
		const focusedRow = () => page.evaluate(() => document.activeElement?.closest("li")?.id);
		await page.waitForFunction(rowId => document.activeElement?.closest("li")?.id === rowId, `delivery-${head.id}`);
		expect(await focusedRow()).toBe(`delivery-${head.id}`);

		// The receiver gets the statuses in the order they happened.
		await env.receiver.waitFor(request => toErp(request, "in progress"), 30_000);
		const arrived = env.receiver.requests.filter(request => request.path === receiverPath("erp") && request.body.includes("o-queued")).map(request => (JSON.parse(request.body) as { data: { status: string } }).data.status);
		expect(arrived).toEqual(["staged", "in progress"]);
		env.receiver.setDefault({ status: 200, body: "ok" });
	});

	it("deletes only after a confirmation, usable by keyboard", async () => {
		await page.getByRole("button", { name: "Delete" }).focus();
		await page.keyboard.press("Enter");
		const dialog = page.getByRole("dialog", { name: /Delete/ });
		await dialog.waitFor();
		// Focus starts on Cancel; Escape closes without deleting.
		expect(await page.evaluate(() => document.activeElement?.textContent)).toBe("Cancel");
		await page.keyboard.press("Escape");
		await dialog.waitFor({ state: "hidden" });
		expect((await api("GET", `/webhooks/${webhookId}`)).status).toBe(200);

		await page.getByRole("button", { name: "Delete" }).click();
		await dialog.getByRole("button", { name: "Delete webhook" }).click();
		await page.getByRole("heading", { name: "Webhooks", level: 1 }).waitFor();
		expect(new URL(page.url()).pathname).toBe("/webhooks");
		expect((await api("GET", `/webhooks/${webhookId}`)).status).toBe(404);
		await page.getByRole("link", { name: "Archive" }).waitFor();
		expect(await page.getByRole("link", { name: "Orders to ERP (renamed)" }).count()).toBe(0);
	});

	it("creates a webhook with the keyboard alone", async () => {
		await page.getByRole("button", { name: "New webhook" }).focus();
		await page.keyboard.press("Enter");
		// Focus moves into the form, on Webhook Name.
		await page.waitForFunction(() => document.activeElement?.id === "create-name");
		await page.keyboard.type("Typed by keyboard");
		await page.keyboard.press("Tab");
		await page.keyboard.type(`${env.receiver.url}${receiverPath("keyboard")}`);
		await page.keyboard.press("Tab");
		// The first event type's checkbox; a new form starts with tasking:order_status ticked, and
		// Space toggles the focused one.
		const focused = () => page.evaluate(() => ({ value: (document.activeElement as HTMLInputElement).value, checked: (document.activeElement as HTMLInputElement).checked }));
		const first = await focused();
		expect(["tasking:order_status", "tasking:order_created"]).toContain(first.value);
		expect(first.checked).toBe(first.value === "tasking:order_status");
		await page.keyboard.press("Space");
		expect((await focused()).checked).toBe(!first.checked);
		if (first.checked) await page.keyboard.press("Space");
		const firstTopic = first.value;
		await page.keyboard.press("Shift+Tab");
		await page.keyboard.press("Enter");
		await page.locator(".secret-panel").waitFor();
		const names = (await api("GET", "/webhooks")).body.webhooks.map((webhook: { name: string; events: string[] }) => [webhook.name, webhook.events]);
		expect(names).toContainEqual(["Typed by keyboard", expect.arrayContaining([firstTopic, "tasking:order_status"])]);
		await page.getByRole("button", { name: "I have stored the secret" }).press("Enter");
	});

	it("turns email on and off, as /user/details then shows, and explains a 412 in words", async () => {
		await page.getByRole("link", { name: "Notifications" }).click();
		await page.getByRole("heading", { name: "Notification settings" }).waitFor();
		const emailSwitch = page.getByRole("switch", { name: "Email for Tasking order status updates" });
		expect(await emailSwitch.getAttribute("aria-checked")).toBe("false");
		await expectAccessible("notification settings");
		await screenshotBothWidths(page, "notifications");
		await expectNoSidewaysScroll();

		const emailSetting = async () => (await api("GET", "/user/details")).body.user_metadata.notifications[0].settings.find((setting: { topic: string }) => setting.topic === "tasking:order_status").email;
		await emailSwitch.click();
		await page.waitForFunction(() => document.querySelector('[role="switch"]')?.getAttribute("aria-checked") === "true");
		expect(await emailSetting()).toBe(true);
		await emailSwitch.click();
		await page.waitForFunction(() => document.querySelector('[role="switch"]')?.getAttribute("aria-checked") === "false");
		expect(await emailSetting()).toBe(false);

		// Changed elsewhere (another tab): the page's ETag is stale, the save is refused and explained.
		await api("PUT", "/user/settings", { notifications: [{ category: "tasking", settings: [{ topic: "tasking:order_status", email: true }] }] });
		await emailSwitch.click();
		const alert = page.getByRole("alert").filter({ hasText: "Not saved" });
		await alert.waitFor();
		expect(await alert.textContent()).toMatch(/changed somewhere else .* nothing was saved/);
		// The switch now shows the current state, and nothing was overwritten.
		await page.waitForFunction(() => document.querySelector('[role="switch"]')?.getAttribute("aria-checked") === "true");
		expect(await emailSetting()).toBe(true);
	});

	it("signs out when the token is refused, saying why", async () => {
		await page.evaluate(() => sessionStorage.setItem("satellite-webhooks.token", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJtYWxsb3J5In0.c2lnbmF0dXJl"));
		await page.reload();
		await page.getByRole("heading", { name: "Sign in" }).waitFor();
		expect(await page.getByRole("alert").textContent()).toMatch(/You were signed out: Token signature is invalid/);
		expect(await page.evaluate(() => Object.keys(sessionStorage))).toEqual([]);
	});
});
