// OpenTelemetry traces in a cluster (gateway, dispatcher and notifier as real processes, their
// own NATS with JetStream, PostgreSQL): one event posted to the HTTP intake with a caller's
// traceparent is one trace across the gateway's process, the JetStream channel (the message's
// headers) and the dispatcher's and notifier's processes, down to each attempt and the email.
// The receiver answers the first attempt 500: the retry, claimed from the database by the
// dispatcher, joins the same trace from the context stored with the message. Spans are exported
// by the processes' real OTLP/HTTP exporter to a receiver started here. The embedded mode, JSON
// and protobuf, is tracing.test.ts.
import crypto from "node:crypto";
import { Cluster, describeCluster, eventually, orderEvents, withClusterLogs } from "./helpers/cluster";
import { startOtlpReceiver, type OtlpReceiver, type ReceivedSpan } from "./helpers/otlp-receiver";

const INTAKE = "/id/v3/events/tasking.order_status";
const CUSTOMER = "traced-co";
const SPAN_KIND = { server: 2, client: 3, producer: 4, consumer: 5 } as const;
const STATUS_ERROR = 2;

describeCluster("tracing in a cluster", () => {
	let otlp: OtlpReceiver | undefined;
	let cluster: Cluster | undefined;
	afterEach(async () => {
		await cluster?.close();
		cluster = undefined;
		await otlp?.close();
	}, 60_000);

	it("one trace id from the intake request, across the gateway, the channel and the dispatcher and notifier processes, to every attempt, the retry included", async () => {
		otlp = await startOtlpReceiver();
		// The SDK's own variable: spans leave within 100 ms rather than 5 s.
		cluster = await Cluster.start({ label: "tracing", env: { OTEL_EXPORTER_OTLP_ENDPOINT: otlp.url, OTEL_BSP_SCHEDULE_DELAY: "100" } });
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			await c.startRoles(["gateway", "gateway"], ["dispatcher", "dispatcher"], ["notifier", "notifier"]);
			const token = await c.token("ada", { customer: CUSTOMER, email: "ada@example.com", name: "Ada" });
			await c.optInToEmail(token);
			const webhook = await c.createWebhook(token, CUSTOMER);
			c.script(webhook, [{ status: 500, body: "not yet" }]);
			const producer = await c.token("orders-service", { scope: "events:publish" });

			const callerTrace = crypto.randomBytes(16).toString("hex");
			const callerSpan = crypto.randomBytes(8).toString("hex");
			const [event] = orderEvents(1, { customer: CUSTOMER, users: ["ada"], prefix: "traced" }).map(item => ({ ...item, status: "fulfilled" }));
			const posted = await c.request("POST", INTAKE, { token: producer, body: event, headers: { traceparent: `00-${callerTrace}-${callerSpan}-01` } });
			expect(posted.status).toBe(202);

			const attempts = (spans: ReceivedSpan[]) => spans.filter(span => span.name === "webhook attempt").sort((a, b) => Number(a.attributes["webhook.attempt"]) - Number(b.attributes["webhook.attempt"]));
			const spans = await eventually(
				() => otlp!.spans.filter(span => span.traceId === callerTrace),
				found => attempts(found).length === 2 && found.some(span => span.name === "email send" && span.attributes["email.result"] === "sent"),
				"both attempts and the email in the caller's trace",
			);
			const byId = new Map(spans.map(span => [span.spanId, span]));
			const parentOf = (span: ReceivedSpan | undefined) => (span ? byId.get(span.parentSpanId) : undefined);

			// The gateway's process: the request, and the message it stored in JetStream.
			const http = spans.find(span => span.kind === SPAN_KIND.server && span.name === `POST ${INTAKE}`);
			expect(http).toMatchObject({ parentSpanId: callerSpan, serviceName: "api,topics,webhooks,users" });
			const publish = spans.find(span => span.kind === SPAN_KIND.producer && span.name === "tasking.order_status publish");
			expect(publish?.serviceName).toBe("api,topics,webhooks,users");
			expect(parentOf(parentOf(publish))).toBe(http);

			// The channel: each consumer group's process continues from the message's headers. The
			// dispatcher may have taken it more than once (an event that arrives before the
			// dispatcher has discovered the webhooks service is redelivered a second later): a
			// take that could not persist it says so.
			const consumed = (group: string) => spans.filter(span => span.kind === SPAN_KIND.consumer && span.attributes["messaging.consumer.group.name"] === group);
			for (const group of ["dispatcher", "notifier"]) {
				expect(consumed(group).length).toBeGreaterThan(0);
				for (const span of consumed(group)) expect(span).toMatchObject({ name: "tasking.order_status process", serviceName: group, parentSpanId: publish!.spanId });
			}

			// The dispatcher's process: the context stored with the message is each attempt's parent.
			const [message] = await c.db("delivery_messages").where({ event_id: event.event_id });
			const [, , storedSpan] = String(message.trace_context).split("-");
			const persisted = consumed("dispatcher").find(span => span.spanId === storedSpan)!;
			expect(message.trace_context).toBe(`00-${callerTrace}-${persisted.spanId}-01`);
			for (const span of consumed("dispatcher")) if (span !== persisted) expect(span.statusCode).toBe(STATUS_ERROR);
			const [delivery] = await c.db("deliveries").where({ event_id: event.event_id });
			const [first, retry] = attempts(spans);
			for (const attempt of [first, retry]) {
				expect(attempt).toMatchObject({ kind: SPAN_KIND.client, serviceName: "dispatcher", parentSpanId: persisted.spanId });
				expect(attempt.attributes).toMatchObject({ "webhook.id": webhook.id, "webhook.delivery.id": delivery.id, "server.address": new URL(webhook.url).hostname });
			}
			expect(first.attributes).toMatchObject({ "webhook.attempt": 1, "http.response.status_code": 500, "error.type": "500" });
			expect(retry.attributes).toMatchObject({ "webhook.attempt": 2, "http.response.status_code": 200 });

			// The notifier's process: the email, under the notifier's consumption of the message.
			const [outbox] = await c.db("email_outbox").where({ event_id: event.event_id });
			// (An email whose first attempt found the users service not yet discovered waits and is tried again.)
			const emailed = spans.filter(span => span.name === "email send");
			for (const span of emailed) expect(span).toMatchObject({ serviceName: "notifier", parentSpanId: consumed("notifier").at(-1)!.spanId, attributes: expect.objectContaining({ "email.outbox_id": outbox.id }) });
			expect(emailed.find(span => span.attributes["email.result"] === "sent")).toMatchObject({
				serviceName: "notifier",
				parentSpanId: consumed("notifier").at(-1)!.spanId,
				attributes: expect.objectContaining({ "email.result": "sent", "smtp.response": expect.stringMatching(/^250/) }),
			});
			for (const span of spans) for (const value of Object.values(span.attributes)) expect(String(value)).not.toContain(webhook.path);
			expect(otlp!.rejected).toEqual([]);
		});
	}, 240_000);
});
