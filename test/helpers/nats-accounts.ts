// NATS's decentralized (JWT) auth for a test's own nats-server: an operator, its system account,
// one account with JetStream, and a user of that account whose .creds file a node is given
// (NATS_CREDS_FILE), as `nsc` would make them. The server trusts the operator and knows both
// accounts from its configuration file (a memory resolver), so no account server is needed.
//
//   const accounts = await makeNatsAccounts(dir);
//   await nats.start(["-c", accounts.serverConfigFile]);
//   env.NATS_CREDS_FILE = accounts.credsFile;
import fs from "node:fs";
import path from "node:path";
import { createAccount, createOperator, createUser, encodeAccount, encodeOperator, encodeUser, fmtCreds } from "@nats-io/jwt";

export interface NatsAccounts {
	/** nats-server's configuration: the operator, and the accounts preloaded. */
	serverConfigFile: string;
	/** The user's JWT and NKey seed. */
	credsFile: string;
	/** A user of another operator's account: the server must refuse it. */
	strangerCredsFile: string;
}

// An account's limits default to none at all (no connection, no subscription): -1 is unlimited.
const UNLIMITED_WITH_JETSTREAM = { conn: -1, subs: -1, data: -1, payload: -1, imports: -1, exports: -1, leaf: -1, wildcards: true, mem_storage: -1, disk_storage: -1, streams: -1, consumer: -1 };

export async function makeNatsAccounts(dir: string): Promise<NatsAccounts> {
	fs.mkdirSync(dir, { recursive: true });
	const operator = createOperator();
	const system = createAccount();
	const account = createAccount();
	const user = createUser();
	const operatorJwt = await encodeOperator("test-operator", operator, { system_account: system.getPublicKey() });
	const systemJwt = await encodeAccount("SYS", system, {}, { signer: operator });
	const accountJwt = await encodeAccount("webhooks", account, { limits: UNLIMITED_WITH_JETSTREAM }, { signer: operator });
	const files = { serverConfigFile: path.join(dir, "nats-server.conf"), credsFile: path.join(dir, "node.creds"), strangerCredsFile: path.join(dir, "stranger.creds") };
	fs.writeFileSync(
		files.serverConfigFile,
		[
			`operator: ${operatorJwt}`,
			`system_account: ${system.getPublicKey()}`,
			"resolver: MEMORY",
			"resolver_preload: {",
			`  ${system.getPublicKey()}: ${systemJwt}`,
			`  ${account.getPublicKey()}: ${accountJwt}`,
			"}",
			"",
		].join("\n"),
	);
	fs.writeFileSync(files.credsFile, fmtCreds(await encodeUser("node", user, account), user), { mode: 0o600 });
	const stranger = createUser();
	fs.writeFileSync(files.strangerCredsFile, fmtCreds(await encodeUser("stranger", stranger, createAccount()), stranger), { mode: 0o600 });
	return files;
}
