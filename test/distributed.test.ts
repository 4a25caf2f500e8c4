// Distributed mode: the same services split across brokers that talk over a real NATS server,
// sharing a real PostgreSQL database. The gateway node owns no data; requests cross NATS.
import { setTimeout as sleep } from "node:timers/promises";
import crypto from "node:crypto";
import { dropIntakeStreams } from "../lib/intake-jetstream";
import { startStack, type Stack } from "./helpers/stack";
import { describeWhere, TEST_NATS_URL } from "./helpers/services";

const describeWithNats = describeWhere({ nats: true, postgres: true });

describeWithNats("distributed mode over NATS", () => {
	const namespace = `test-${crypto.randomBytes(4).toString("hex")}`;
	let gateway: Stack;
	let topicsNode: Stack;

	beforeAll(async () => {
		const shared = { TRANSPORTER: TEST_NATS_URL, NAMESPACE: namespace };
		topicsNode = await startStack({ services: ["topics"], database: "postgres", env: { ...shared, NODE_ID: `${namespace}-topics` } });
		gateway = await startStack({
			services: ["api"],
			database: "postgres",
			schema: topicsNode.schema,
			dataDir: topicsNode.dataDir,
			env: { ...shared, NODE_ID: `${namespace}-gateway` },
		});
		await gateway.app.broker.waitForServices(["topics"], 10_000);
	});

	afterAll(async () => {
		await gateway?.stopServices();
		await topicsNode?.stop();
		await gateway?.db.destroy();
		await dropIntakeStreams(TEST_NATS_URL, namespace);
	});

	it("serves a route whose owning service runs on another node", async () => {
		const token = await gateway.token("alice");
		const response = await gateway.request("GET", "/id/v3/webhooks/events", { token });
		expect(response.status).toBe(200);
		expect(response.body.map((entry: { topic: string }) => entry.topic)).toContain("tasking:order_status");
		// The gateway node runs no topics service of its own: the call crossed NATS.
		expect(gateway.app.broker.getLocalService("topics")).toBeFalsy();
	});

	it("answers 503 problem details once the owning node is gone", async () => {
		await topicsNode.stopServices();
		const token = await gateway.token("alice");
		let status = 0;
		// Wait (bounded) until the gateway's registry notices the node left.
		for (let i = 0; i < 50 && status !== 503; i++) {
			status = (await gateway.request("GET", "/id/v3/webhooks/events", { token })).status;
			if (status !== 503) await sleep(200);
		}
		expect(status).toBe(503);
	});
});
