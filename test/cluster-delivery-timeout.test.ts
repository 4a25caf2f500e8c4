// Delivery timeout at the dispatcher, in a cluster: a receiver that never answers is recorded
// as a Timeout once DELIVERY_TIMEOUT has passed (not earlier, not never), and the delivery is
// retried on the schedule until the receiver answers. Gateway and dispatcher are separate
// processes over this test's own NATS; the event comes from an outside node through the channel.
import { Cluster, describeCluster, eventually, orderEvents, printFigures, withClusterLogs, type ClusterWebhook } from "./helpers/cluster";
import { DEFAULT_JITTER_FRACTION } from "../lib/retry-schedule";

const TIMEOUT_MS = 1_500;
const FIRST_RETRY_MS = 2_000;

describeCluster("cluster: delivery timeout at the dispatcher", () => {
	let cluster: Cluster | undefined;
	let webhook: ClusterWebhook;
	let token: string;

	beforeAll(async () => {
		cluster = await Cluster.start({
			label: "timeout",
			env: { DELIVERY_TIMEOUT: `${TIMEOUT_MS}ms`, DELIVERY_RETRY_SCHEDULE: `${FIRST_RETRY_MS}ms,4s,6s`, DELIVERY_LEASE: "10s" },
		});
		await withClusterLogs(cluster, async () => {
			await cluster!.startRoles(["gateway", "gateway"], ["dispatcher", "dispatcher"]);
			token = await cluster!.token("tim", { customer: "timeout-co" });
			webhook = await cluster!.createWebhook(token, "timeout-co");
		});
	}, 120_000);
	afterAll(() => cluster?.close(), 60_000);

	it("records a hanging receiver as Timeout after DELIVERY_TIMEOUT, then retries it", async () => {
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			c.script(webhook, [{ hang: true }]);
			const events = orderEvents(1, { customer: "timeout-co", users: ["tim"], prefix: "timeout" });
			const sent = await c.send(events);
			await c.waitForDeliveries([webhook], events);

			const requests = c.received(webhook);
			expect(requests.length).toBe(2);
			const [hung, retried] = requests;
			expect(hung.answeredStatus).toBeUndefined();
			expect(retried.answeredStatus).toBe(200);
			expect(retried.headers["webhook-id"]).toBe(hung.headers["webhook-id"]);

			const list = await c.request("GET", `/id/v3/webhooks/${webhook.id}/deliveries`, { token });
			expect(list.status).toBe(200);
			expect(list.body.deliveries).toHaveLength(1);
			const deliveryId: string = list.body.deliveries[0].id;
			expect(`msg_${deliveryId}`).toBe(hung.headers["webhook-id"]);
			const detail = await eventually(
				() => c.request("GET", `/id/v3/webhooks/${webhook.id}/deliveries/${deliveryId}`, { token }),
				answer => answer.body?.status === "succeeded",
				"the delivery to be recorded as succeeded",
			);
			expect(detail.body).toMatchObject({ status: "succeeded", attempt_count: 2 });
			const [first, second] = detail.body.attempts;
			// The retry comes on the schedule: its first offset counts from the first attempt's start
			// (less the jitter, which only moves a retry earlier). Not from the hung request's arrival,
			// which came a connection's set-up later: a CI run had the two 1,792 ms apart.
			expect(retried.receivedAt.getTime() - Date.parse(first.attempted_at)).toBeGreaterThanOrEqual(FIRST_RETRY_MS * (1 - DEFAULT_JITTER_FRACTION));
			expect(first).toMatchObject({ success: false, status_code: null, error_kind: "timeout", title: "Timeout", detail: "No response within 1.5 s" });
			// Given up when DELIVERY_TIMEOUT ran out, not before.
			expect(first.duration_ms).toBeGreaterThanOrEqual(TIMEOUT_MS);
			expect(second).toMatchObject({ success: true, status_code: 200, error_kind: null });

			const figures = c.deliveryFigures([webhook], events, sent);
			printFigures("delivery timeout", { ...figures, timeout_ms: TIMEOUT_MS, first_attempt_ms: first.duration_ms });
			expect(figures).toMatchObject({ lost: 0, bad_signatures: 0, wrong_payloads: 0, split_deliveries: 0 });
		});
	}, 120_000);
});
