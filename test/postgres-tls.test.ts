// PostgreSQL over TLS, as locked-down databases demand it: the test's own PostgreSQL takes TLS
// connections only (hostssl) that present a client certificate of its CA (clientcert=verify-ca),
// its own certificate signed by that CA. A node given DATABASE_URL=…?sslmode=verify-full with
// sslrootcert, sslcert and sslkey runs its migrations and answers /health, every connection it
// holds being TLS. A node that cannot trust the certificate, one without a client certificate,
// one that asks for no TLS, and one that demands TLS of a server without it stop at start-up with
// exit 78, naming DATABASE_URL and what to change, instead of waiting out STARTUP_CONNECT_TIMEOUT.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import knex from "knex";
import { postgresBinDir, startPostgresServer, type PostgresServer } from "./helpers/postgres-server";
import { freePort } from "./helpers/net";
import { RoleProcess } from "./helpers/role-process";
import { describeWhere, TEST_DATABASE_URL } from "./helpers/services";

// The shared server for the last case, and a server of the test's own for the others.
const describeWithPostgres = describeWhere({ postgres: true, programs: { "PostgreSQL's programs (initdb, pg_ctl)": postgresBinDir() !== undefined } });

describeWithPostgres("PostgreSQL over TLS", () => {
	let pg: PostgresServer | undefined;
	let root: string;
	const nodes: RoleProcess[] = [];

	beforeAll(async () => {
		pg = await startPostgresServer({ mutualTls: true });
		root = fs.mkdtempSync(path.join(os.tmpdir(), "swh-pg-tls-"));
	}, 120_000);
	afterAll(async () => {
		await Promise.all(nodes.map(node => node.kill("SIGKILL")));
		await pg?.close();
		fs.rmSync(root, { recursive: true, force: true });
	}, 60_000);

	/** The gateway's services as a process of their own, on this database. */
	async function startNode(name: string, databaseUrl: string): Promise<RoleProcess> {
		const node = new RoleProcess(
			name,
			{
				PATH: process.env.PATH ?? "",
				NODE_ENV: "production",
				SERVICES: "api,topics,webhooks,users",
				AUTH_JWT_SECRET: "t".repeat(40),
				SECRETS_KEY: Buffer.alloc(32, 3).toString("base64"),
				DATABASE_URL: databaseUrl,
				DATA_DIR: path.join(root, name),
				HOST: "127.0.0.1",
				PORT: String(await freePort()),
				OPS_PORT: String(await freePort()),
				STARTUP_CONNECT_TIMEOUT: "20s",
			},
			path.join(root, `${name}.log`),
		);
		nodes.push(node);
		node.start();
		return node;
	}

	/** The server's URL with sslmode=verify-full and the query's other TLS parameters. */
	const tlsUrl = (parameters: Record<string, string>) => `${pg!.url}?${new URLSearchParams({ sslmode: "verify-full", ...parameters })}`;

	it("runs on a server that takes TLS only, given its CA and a client certificate, every connection TLS", async () => {
		const { caFile, certFile, keyFile } = pg!.tls!;
		const verifiedUrl = tlsUrl({ sslrootcert: caFile, sslcert: certFile, sslkey: keyFile });
		const node = await startNode("verified", verifiedUrl);
		await node.waitHealthy();
		const admin = knex({ client: "pg", connection: verifiedUrl, pool: { min: 0, max: 1 } });
		try {
			// The migrations wrote the service's tables through those connections.
			expect(await admin.schema.hasTable("webhooks")).toBe(true);
			const { rows } = await admin.raw<{ rows: Array<{ ssl: boolean; application_name: string }> }>(
				"SELECT s.ssl, a.application_name FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()",
			);
			expect(rows.length).toBeGreaterThan(0);
			expect(rows.filter(row => !row.ssl)).toEqual([]);
		} finally {
			await admin.destroy();
		}
	}, 120_000);

	it("stops a node that does not trust the server's certificate: exit 78, naming sslrootcert", async () => {
		const node = await startNode("untrusted", tlsUrl({}));
		expect(await node.exited).toEqual({ code: 78, signal: null });
		expect(node.tail()).toMatch(/DATABASE_URL: PostgreSQL at postgres:\/\/postgres@127\.0\.0\.1:\d+\/postgres\?sslmode=verify-full presented a certificate this node does not trust \((UNABLE_TO_VERIFY_LEAF_SIGNATURE|SELF_SIGNED_CERT_IN_CHAIN)\); sslrootcert=<file> in DATABASE_URL names the CA that signed it/);
	}, 60_000);

	it("stops a node without a client certificate: exit 78, with the server's refusal", async () => {
		const node = await startNode("no-client-certificate", tlsUrl({ sslrootcert: pg!.tls!.caFile }));
		expect(await node.exited).toEqual({ code: 78, signal: null });
		expect(node.tail()).toMatch(/DATABASE_URL: PostgreSQL at postgres:\/\/postgres@127\.0\.0\.1:\d+\/postgres\?sslmode=verify-full&sslrootcert=\S+ refused the connection: .*certificate/);
	}, 60_000);

	it("stops a node that asks a TLS-only server for no TLS: exit 78, with the server's refusal", async () => {
		const node = await startNode("plain-client", pg!.url);
		expect(await node.exited).toEqual({ code: 78, signal: null });
		expect(node.tail()).toMatch(/DATABASE_URL: PostgreSQL at postgres:\/\/postgres@127\.0\.0\.1:\d+\/postgres refused the connection: .*no encryption/);
	}, 60_000);

	it("stops a node that demands TLS of a server without it: exit 78, instead of talking in the clear", async () => {
		// The machine's shared PostgreSQL has no TLS; the node only opens a connection to it.
		const node = await startNode("plain-server", `${TEST_DATABASE_URL}?sslmode=verify-full`);
		expect(await node.exited).toEqual({ code: 78, signal: null });
		expect(node.tail()).toMatch(/DATABASE_URL: PostgreSQL at postgres:\/\/postgres@127\.0\.0\.1:5432\/test\?sslmode=verify-full offers no TLS, which sslmode in DATABASE_URL demands/);
	}, 60_000);
});
