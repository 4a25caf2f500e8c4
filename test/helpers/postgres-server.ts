// A PostgreSQL server that belongs to one test: its own cluster (initdb) in a temporary folder,
// on a free loopback port, started and stopped with pg_ctl. The test may crash it (an immediate
// shutdown: no checkpoint, shared memory and unflushed WAL thrown away, crash recovery at the
// next start), which the machine's shared server must never see.
//
//   const pg = await startPostgresServer();
//   pg.url                          // postgres://postgres@127.0.0.1:<port>/postgres
//   await pg.crash();               // pg_ctl stop -m immediate
//   await pg.start();               // same port, same data: crash recovery, then ready
//   await pg.close();               // stops it and removes its folder
//   const pg = await startPostgresServer({ mutualTls: true });  // TLS only, client certificates: pg.tls
//
// PostgreSQL refuses to run as root; as root (CI) its programs run as the `postgres` user, who
// owns the folder.
import { execFile } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { ensureDevelopmentCertificates } from "../../lib/dev-certificates";
import { freePort } from "./net";
import { tailOf } from "./nats-server";

const run = promisify(execFile);

/** The server programs: PG_BIN_DIR, or the newest of Debian's /usr/lib/postgresql/<version>/bin. */
export function postgresBinDir(): string | undefined {
	if (process.env.PG_BIN_DIR) return process.env.PG_BIN_DIR;
	const root = "/usr/lib/postgresql";
	if (!fs.existsSync(root)) return undefined;
	const versions = fs.readdirSync(root).filter(name => fs.existsSync(path.join(root, name, "bin", "pg_ctl")));
	versions.sort((a, b) => Number(b) - Number(a));
	return versions.length > 0 ? path.join(root, versions[0], "bin") : undefined;
}

export interface PostgresServer {
	readonly port: number;
	readonly url: string;
	/**
	 * With mutualTls: the CA that signed the server's certificate (sslrootcert), and a client
	 * certificate of that CA with its key (sslcert, sslkey).
	 */
	readonly tls?: { caFile: string; certFile: string; keyFile: string };
	start(): Promise<void>;
	/** An immediate shutdown, as a crash: no checkpoint, the WAL not yet flushed is lost. */
	crash(): Promise<void>;
	close(): Promise<void>;
}

export interface PostgresServerOptions {
	/**
	 * The server takes TLS connections only (hostssl in pg_hba.conf) that present a client
	 * certificate of its CA (clientcert=verify-ca), its own certificate signed by that CA, made in its
	 * folder.
	 */
	mutualTls?: boolean;
	/** Server settings (`-c name=value`), e.g. to match another server's. */
	settings?: Record<string, string>;
}

export async function startPostgresServer(options: PostgresServerOptions = {}): Promise<PostgresServer> {
	const bin = postgresBinDir();
	if (!bin) throw new Error("PostgreSQL's server programs were not found (install Debian's postgresql, or set PG_BIN_DIR)");
	const root = fs.mkdtempSync(path.join(os.tmpdir(), "swh-pg-"));
	const dataDir = path.join(root, "data");
	const logFile = path.join(root, "postgres.log");
	const port = await freePort();
	const asRoot = process.getuid?.() === 0;
	if (asRoot) {
		const [uid, gid] = await Promise.all(["-u", "-g"].map(async flag => Number((await run("id", [flag, "postgres"])).stdout.trim())));
		fs.chownSync(root, uid, gid);
	}
	const pgRun = (program: string, args: string[]) => {
		const [file, argv] = asRoot ? ["runuser", ["-u", "postgres", "--", path.join(bin, program), ...args]] : [path.join(bin, program), args];
		return run(file, argv, { cwd: root }).catch(err => {
			throw new Error(`${program} failed: ${(err as { stderr?: string }).stderr ?? String(err)}\n${tailOf(logFile)}`);
		});
	};
	await pgRun("initdb", ["-D", dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"]);
	let extraOptions = Object.entries(options.settings ?? {})
		.map(([name, value]) => ` -c ${name}=${value}`)
		.join("");
	let tls: PostgresServer["tls"];
	if (options.mutualTls) {
		const certificates = ensureDevelopmentCertificates(path.join(root, "certificates"));
		// The development certificate serves for either end (it allows clientAuth too).
		tls = { caFile: certificates.caFile, certFile: certificates.certFile, keyFile: certificates.keyFile };
		// PostgreSQL reads its key only when the key is its own and no one else may read it.
		const { uid, gid } = fs.statSync(dataDir);
		for (const file of [certificates.certFile, certificates.keyFile]) fs.chownSync(file, uid, gid);
		fs.chownSync(path.dirname(certificates.keyFile), uid, gid);
		const hba = path.join(dataDir, "pg_hba.conf");
		fs.writeFileSync(hba, fs.readFileSync(hba, "utf8").replace(/^host(\s.*)$/gm, "hostssl$1 clientcert=verify-ca"));
		extraOptions += ` -c ssl=on -c ssl_cert_file=${certificates.certFile} -c ssl_key_file=${certificates.keyFile} -c ssl_ca_file=${certificates.caFile}`;
	}
	let closed = false;
	let running = false;

	const server: PostgresServer = {
		port,
		url: `postgres://postgres@127.0.0.1:${port}/postgres`,
		tls,
		async start() {
			if (closed) throw new Error(`the PostgreSQL server on port ${port} was closed`);
			// -w: pg_ctl returns once the server accepts connections (after any crash recovery).
			const serverOptions = `-p ${port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=${root}${extraOptions}`;
			await pgRun("pg_ctl", ["start", "-w", "-t", "60", "-D", dataDir, "-l", logFile, "-o", serverOptions]);
			running = true;
		},
		async crash() {
			if (!running) return;
			await pgRun("pg_ctl", ["stop", "-w", "-D", dataDir, "-m", "immediate"]);
			running = false;
		},
		async close() {
			closed = true;
			await server.crash().catch(() => undefined);
			fs.rmSync(root, { recursive: true, force: true });
		},
	};
	await server.start();
	return server;
}
