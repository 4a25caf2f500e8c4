// `npm run bench [-- part ...]`: runs benchmark parts and prints ONE JSON document on stdout,
// {part: figures, ...}. Logs go to stderr. Each part is a module bench/<part>.ts exporting
// `async function run(): Promise<object>`; a part whose file does not exist is skipped with a note.
import fs from "node:fs";
import path from "node:path";

const DEFAULT_PARTS = ["api", "sender", "delivery", "notifier", "scheduler", "retention"];

interface BenchPart {
	run(): Promise<object>;
}

function requestedParts(): string[] {
	const named = process.argv.slice(2).filter(arg => arg !== "--");
	for (const name of named) {
		if (!/^[a-z][a-z0-9-]*$/.test(name)) throw new Error(`"${name}" is not a benchmark part name`);
	}
	return named.length ? [...new Set(named)] : DEFAULT_PARTS;
}

async function main(): Promise<void> {
	const writeStdout = process.stdout.write.bind(process.stdout);
	// Anything a part logs goes to stderr, so that stdout is exactly the JSON document.
	console.log = console.error;
	console.info = console.error;

	const results: Record<string, object> = {};
	for (const part of requestedParts()) {
		const file = path.join(__dirname, `${part}.ts`);
		if (!fs.existsSync(file)) {
			results[part] = { skipped: `bench/${part}.ts does not exist (yet)` };
			continue;
		}
		process.stderr.write(`bench: ${part}\n`);
		const started = Date.now();
		try {
			const module = (await import(file)) as BenchPart;
			results[part] = { ...(await module.run()), elapsed_seconds: Math.round((Date.now() - started) / 1000) };
		} catch (err) {
			results[part] = { error: err instanceof Error ? err.message : String(err) };
			process.exitCode = 1;
		}
	}
	writeStdout(`${JSON.stringify({ generated_at: new Date().toISOString(), node: process.version, ...results }, null, 2)}\n`);
}

main().catch(err => {
	process.stderr.write(`bench: ${err instanceof Error ? err.message : String(err)}\n`);
	process.exit(2);
});
