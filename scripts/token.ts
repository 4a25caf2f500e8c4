// Prints a bearer token that the embedded default accepts, alone on standard output:
//   npm run -s token -- --sub alice --email alice@example.com [--name Alice] [--customer acme] [--scope events:publish] [--expires 12h]
// It reads DATA_DIR and AUTH_JWT_SECRET exactly as the server does.
import { parseArgs } from "node:util";
import { loadConfig } from "../lib/config";
import { mintToken } from "../lib/auth";

async function main(): Promise<void> {
	const { values } = parseArgs({
		options: {
			sub: { type: "string" },
			email: { type: "string" },
			name: { type: "string" },
			customer: { type: "string" },
			// Repeatable, or space-separated: the token's `scope` claim.
			scope: { type: "string", multiple: true },
			expires: { type: "string", default: "12h" },
		},
	});
	if (!values.sub) {
		process.stderr.write("usage: npm run -s token -- --sub <user id> [--email <addr>] [--name <name>] [--customer <id>] [--scope events:publish] [--expires 12h]\n");
		process.exit(64);
	}
	const { config } = loadConfig(process.env);
	const token = await mintToken(config, {
		sub: values.sub,
		email: values.email,
		name: values.name,
		customer: values.customer,
		scope: values.scope?.join(" ").trim() || undefined,
		expiresIn: values.expires,
	});
	process.stdout.write(`${token}\n`);
}

main().catch(err => {
	process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
	process.exit(1);
});
