// `npm run bench -- api`, as docs/benchmarks.md shows it, with a short load: one JSON document with the
// bare route, the authenticated list (a full page of the 25 seeded webhooks) and the create, every
// request answered 2xx; and BENCH_PROFILE_DIR leaves a CPU profile of each server. Figures are
// machine-dependent, so only their shape is checked.
import { execFile } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

interface LoadFigures {
	requests_per_second: number;
	requests: number;
	non_2xx: number;
	errors: number;
	clean?: boolean;
}

describe("npm run bench -- api", () => {
	let profileDir: string;

	beforeAll(() => {
		profileDir = fs.mkdtempSync(path.join(os.tmpdir(), "swh-bench-api-profile-"));
	});

	afterAll(() => fs.rmSync(profileDir, { recursive: true, force: true }));

	it("prints the baseline, the authenticated list and create, and profiles both servers", async () => {
		const { stdout } = await run("npm", ["run", "-s", "bench", "--", "api"], {
			cwd: path.join(__dirname, ".."),
			env: { ...process.env, BENCH_CONNECTIONS: "4", BENCH_DURATION_SECONDS: "1", BENCH_PROFILE_DIR: profileDir },
			maxBuffer: 1 << 20,
		});
		const { api } = JSON.parse(stdout) as {
			api: { error?: string; seed: { webhooks_created: number; list_page_size: number }; baseline_get: LoadFigures; list_get: LoadFigures; create_post: LoadFigures; ratio_list_to_baseline: number };
		};
		expect(api.error).toBeUndefined();
		expect(api.seed).toEqual({ webhooks_created: 25, list_page_size: 25 });
		for (const figures of [api.baseline_get, api.list_get, api.create_post]) {
			expect(figures.requests).toBeGreaterThan(0);
			expect(figures).toMatchObject({ non_2xx: 0, errors: 0 });
		}
		expect(api.list_get.clean).toBe(true);
		expect(api.create_post.clean).toBe(true);
		expect(api.ratio_list_to_baseline).toBeGreaterThan(0);
		for (const server of ["baseline", "stack"]) {
			expect(fs.readdirSync(path.join(profileDir, server)).filter(name => name.endsWith(".cpuprofile")).length).toBeGreaterThan(0);
		}
	}, 180_000);
});
