// The README and docs/ hold together: every relative link reaches a file (and a heading, when it
// names one), and every ```sh block a reader may copy is run by a test. The registry below says
// which test runs which block; a block added to the docs without a test that runs it fails here,
// and so does an entry whose block is gone. A block that cannot run on a test machine (Docker
// Compose has no engine here) is written as ```text instead.
import fs from "node:fs";
import path from "node:path";

const ROOT = path.resolve(__dirname, "..");

/** Every `sh` block of the docs, by file and first line, and the test file that runs it. */
const RUN_BY: Array<{ file: string; firstLine: string; test: string }> = [
	{ file: "README.md", firstLine: "npm install && npm start", test: "test/quickstart.test.ts" },
	{ file: "README.md", firstLine: "npm run listen", test: "test/quickstart.test.ts" },
	{ file: "README.md", firstLine: "WEBHOOK_ALLOW_NETS=127.0.0.1/32,::1/128 WEBHOOK_CA_FILE=data/listen/ca.pem npm start", test: "test/quickstart.test.ts" },
	{ file: "README.md", firstLine: "TOKEN=$(npm run -s token -- --sub orders-service --scope events:publish)", test: "test/quickstart.test.ts" },
	{ file: "README.md", firstLine: "ls data/mail", test: "test/quickstart.test.ts" },
	{ file: "docs/walkthrough.md", firstLine: "TOKEN=$(npm run -s token -- --sub alice --email alice@example.com)", test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/walkthrough.md", firstLine: 'curl -s -H "Authorization: Bearer $TOKEN" $API/webhooks/events', test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/walkthrough.md", firstLine: 'CREATED=$(curl -s -X POST -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \\', test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/walkthrough.md", firstLine: 'curl -s -H "Authorization: Bearer $TOKEN" "$API/webhooks?per_page=10"', test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/walkthrough.md", firstLine: 'curl -s -X PATCH -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \\', test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/walkthrough.md", firstLine: 'curl -s -X POST -H "Authorization: Bearer $TOKEN" $API/webhooks/$ID/rotate', test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/walkthrough.md", firstLine: 'curl -s -X POST -H "Authorization: Bearer $TOKEN" $API/webhooks/$ID/test', test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/walkthrough.md", firstLine: 'curl -s -X PUT -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \\', test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/walkthrough.md", firstLine: "curl -s -o /dev/null -w '%{http_code}\\n' -X DELETE -H \"Authorization: Bearer $TOKEN\" $API/webhooks/$ID", test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/api.md", firstLine: 'curl -s -H "Authorization: Bearer $TOKEN" "$API/webhooks/$ID/deliveries?status=failed&per_page=10"', test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/api.md", firstLine: 'curl -s -H "Authorization: Bearer $TOKEN" "$API/webhooks/$ID/stats?window=24h" | jq .totals', test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/api.md", firstLine: 'curl -s -X POST -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \\', test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/api.md", firstLine: 'curl -s -X PUT -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \\', test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/api.md", firstLine: 'ETAG=$(curl -s -D- -o /dev/null -H "Authorization: Bearer $TOKEN" $API/user/details \\', test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/api.md", firstLine: "curl -s -X POST -d 'List-Unsubscribe=One-Click' \"http://localhost:3000/email/unsubscribe?token=$UNSUB_TOKEN\"", test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/api.md", firstLine: "curl -s http://localhost:3000/openapi.json | jq '.paths | keys'", test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/operations.md", firstLine: "curl -s localhost:3030/health", test: "test/readme-walkthrough.test.ts" },
	{ file: "docs/operations.md", firstLine: "TRANSPORTER=nats://nats:4222 NAMESPACE=prod npm run repl", test: "test/repl.test.ts" },
	{ file: "docs/delivery.md", firstLine: "WEBHOOK_ALLOW_NETS=127.0.0.1/32,::1/128 WEBHOOK_CA_FILE=data/listen/ca.pem npm start", test: "test/quickstart.test.ts" },
	{ file: "docs/delivery.md", firstLine: "TOKEN=$(npm run -s token -- --sub orders-service --scope events:publish)", test: "test/http-intake.test.ts" },
	{ file: "docs/benchmarks.md", firstLine: "BENCH_SCENARIOS=ordering npm run -s bench -- delivery", test: "test/bench-ordering.test.ts" },
	{ file: "docs/cluster.md", firstLine: "TRANSPORTER=nats://127.0.0.1:4222 DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run cluster", test: "test/entrypoint.test.ts" },
];

function docFiles(): string[] {
	const docs = fs
		.readdirSync(path.join(ROOT, "docs"))
		.filter(name => name.endsWith(".md"))
		.map(name => `docs/${name}`);
	return ["README.md", ...docs.sort()];
}

const read = (file: string) => fs.readFileSync(path.join(ROOT, file), "utf8");

/** The text outside fenced code blocks, inline code reduced to a placeholder (links may wrap it). */
function prose(markdown: string): string {
	return markdown.replace(/^```[^\n]*\n[\s\S]*?^```$/gm, "").replace(/`[^`\n]+`/g, "code");
}

/** The anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces to hyphens, repeats numbered. */
function anchors(markdown: string): Set<string> {
	const seen = new Map<string, number>();
	const found = new Set<string>();
	for (const [, heading] of prose(markdown.replace(/`([^`\n]+)`/g, "$1")).matchAll(/^#{1,6} (.+)$/gm)) {
		const base = heading
			.trim()
			.toLowerCase()
			.replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, "")
			.replace(/ /g, "-");
		const count = seen.get(base) ?? 0;
		seen.set(base, count + 1);
		found.add(count === 0 ? base : `${base}-${count}`);
	}
	return found;
}

function shBlocks(file: string): Array<{ file: string; firstLine: string }> {
	return [...read(file).matchAll(/^```sh\n([\s\S]*?)^```$/gm)].map(match => ({ file, firstLine: match[1].split("\n")[0] }));
}

describe("the README and docs/", () => {
	it("find the files they are checked against", () => {
		expect(docFiles()).toEqual(expect.arrayContaining(["README.md", "docs/api.md", "docs/delivery.md", "docs/configuration.md", "docs/cluster.md", "docs/operations.md", "docs/benchmarks.md"]));
	});

	it.each(docFiles())("%s: every relative link points to an existing file, and to an existing heading when it names one", file => {
		const broken: string[] = [];
		for (const [, target] of prose(read(file)).matchAll(/\]\(([^)\s]+)\)/g)) {
			if (/^[a-z]+:/i.test(target)) continue; // https:, mailto:
			const [linkPath, anchor] = target.split("#");
			const resolved = linkPath ? path.join(path.dirname(path.join(ROOT, file)), decodeURIComponent(linkPath)) : path.join(ROOT, file);
			if (!fs.existsSync(resolved)) {
				broken.push(`${target}: no such file`);
				continue;
			}
			if (anchor !== undefined && !(resolved.endsWith(".md") && anchors(fs.readFileSync(resolved, "utf8")).has(anchor))) broken.push(`${target}: no such heading`);
		}
		expect(broken).toEqual([]);
	});

	it("run every sh block in a test named in the registry, and the registry names only blocks that exist", () => {
		const blocks = docFiles().flatMap(shBlocks);
		const key = (block: { file: string; firstLine: string }) => `${block.file}: ${block.firstLine}`;
		// A first line names one block of its file.
		const keys = blocks.map(key);
		expect(keys.filter((name, index) => keys.indexOf(name) !== index)).toEqual([]);
		const registered = RUN_BY.map(key);
		expect(keys.filter(name => !registered.includes(name))).toEqual([]);
		expect(registered.filter(name => !keys.includes(name))).toEqual([]);
	});

	const readers = [...new Set(RUN_BY.map(entry => `${entry.test} ${entry.file}`))].map(pair => pair.split(" ") as [string, string]);
	it.each(readers)("%s exists and reads %s", (test, file) => {
		// The test finds the block in the file itself, so it must name it.
		const source = fs.readFileSync(path.join(ROOT, test), "utf8");
		expect(source).toContain(path.basename(file));
	});
});
