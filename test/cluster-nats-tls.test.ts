// NATS over TLS, as a production cluster often runs it: the test's own nats-server accepting TLS
// only, with a certificate of the test's own CA, and verifying its clients (mutual TLS). A gateway
// and a dispatcher join it as processes of their own with TRANSPORTER=tls://…, NATS_CA_FILE,
// NATS_CERT_FILE and NATS_KEY_FILE; events come from an outside node over the same TLS. Every
// event must be delivered, signed, and every connection the server holds must be TLS, also once
// the roles have reconnected after NATS restarted. A node
// that lacks the CA, or its own certificate, must stop at start-up with exit 78 naming what to
// set, instead of waiting for a server that will never let it in; so must one that demands TLS of
// a server that offers none.
import { Cluster, describeCluster, eventually, orderEvents, printFigures, withClusterLogs } from "./helpers/cluster";
import { TEST_NATS_URL } from "./helpers/services";

const EVENTS = 200;

describeCluster("cluster: NATS with mutual TLS", () => {
	let cluster: Cluster | undefined;

	beforeAll(async () => {
		cluster = await Cluster.start({ label: "natstls", natsTls: true });
		await withClusterLogs(cluster, () => cluster!.startRoles(["gateway", "gateway"], ["dispatcher", "dispatcher"]));
	}, 120_000);
	afterAll(() => cluster?.close(), 60_000);

	it("delivers channel events when every node talks to NATS over TLS with a certificate of its own", async () => {
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			expect(c.natsEnv.TRANSPORTER).toMatch(/^tls:\/\//);
			const token = await c.token("alice", { customer: "acme", email: "alice@example.com" });
			const hook = await c.createWebhook(token, "acme");
			const events = orderEvents(EVENTS, { customer: "acme", users: ["alice"], prefix: "tls" });
			const sent = await c.send(events);
			await c.waitForDeliveries([hook], events);
			const figures = c.deliveryFigures([hook], events, sent);
			printFigures("nats-tls", figures);
			expect(figures).toMatchObject({ expected: EVENTS, lost: 0, bad_signatures: 0, wrong_payloads: 0, unexpected: 0 });

			// The transporter, the intake's channel adapter of each role and the test's producer: the
			// server demands TLS, and says so of each connection it holds.
			const connections = await c.nats.connections();
			expect(connections.length).toBeGreaterThanOrEqual(4);
			expect(connections.filter(connection => !connection.tls_version)).toEqual([]);
		});
	}, 240_000);

	it("reconnects over TLS after NATS restarts, and delivers what comes next", async () => {
		await withClusterLogs(cluster, async () => {
			const c = cluster!;
			const token = await c.token("bob", { customer: "acme", email: "bob@example.com" });
			const hook = await c.createWebhook(token, "acme");
			const roles = [...c.roles.values()];
			await c.nats.stop("SIGKILL");
			await Promise.all(roles.map(role => eventually(() => role.health(), health => health?.status === 503, `${role.name} to report the outage`, 20_000)));
			await c.nats.start();
			await Promise.all(roles.map(role => eventually(() => role.health(), health => health?.status === 200, `${role.name} to reconnect`, 60_000)));

			const events = orderEvents(EVENTS / 2, { customer: "acme", users: ["bob"], prefix: "tls-after" });
			const sent = await c.send(events, { producer: await c.producer() });
			await c.waitForDeliveries([hook], events);
			const figures = c.deliveryFigures([hook], events, sent);
			printFigures("nats-tls after a restart", figures);
			expect(figures).toMatchObject({ expected: EVENTS / 2, lost: 0, bad_signatures: 0, wrong_payloads: 0, unexpected: 0 });
			expect((await c.nats.connections()).filter(connection => !connection.tls_version)).toEqual([]);
		});
	}, 240_000);

	it("stops a node without its certificate at start-up, exit 78, naming NATS_CERT_FILE and NATS_KEY_FILE", async () => {
		const role = await cluster!.spawnRole("dispatcher", "no-certificate", { NATS_CERT_FILE: "", NATS_KEY_FILE: "" });
		expect(await role.exited).toEqual({ code: 78, signal: null });
		expect(role.tail()).toMatch(/TRANSPORTER: NATS at tls:\/\/127\.0\.0\.1:\d+ refused this node's TLS certificate \(ERR_SSL_[A-Z0-9_]+\); a server that verifies its clients wants NATS_CERT_FILE and NATS_KEY_FILE/);
	}, 60_000);

	it("stops a node that does not trust the server's CA at start-up, exit 78, naming NATS_CA_FILE", async () => {
		const role = await cluster!.spawnRole("dispatcher", "no-ca", { NATS_CA_FILE: "" });
		expect(await role.exited).toEqual({ code: 78, signal: null });
		expect(role.tail()).toMatch(/TRANSPORTER: NATS at tls:\/\/127\.0\.0\.1:\d+ presented a certificate this node does not trust \(UNABLE_TO_VERIFY_LEAF_SIGNATURE\); NATS_CA_FILE names the CA that signed it/);
	}, 60_000);

	it("stops a node that demands TLS of a NATS server without it at start-up, exit 78, instead of talking in the clear", async () => {
		// The machine's shared NATS has no TLS; the node only asks it for its greeting.
		const plain = new URL(TEST_NATS_URL);
		const role = await cluster!.spawnRole("dispatcher", "plain-server", { TRANSPORTER: `tls://${plain.host}` });
		expect(await role.exited).toEqual({ code: 78, signal: null });
		expect(role.tail()).toMatch(/TRANSPORTER: NATS at tls:\/\/[\d.]+:\d+ offers no TLS, which this node demands/);
	}, 60_000);
});
