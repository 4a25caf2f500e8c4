// `npm run bench -- sender`, as docs/benchmarks.md shows it: one JSON document on standard output, with
// the floor and both senders measured in the same run against real HTTPS receivers. Figures are
// machine-dependent, so only their shape is checked, and that the receivers answered 200 to
// every request each measurement made (the benchmark itself fails a run with any failure).
import { execFile } from "node:child_process";
import path from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

describe("npm run bench -- sender", () => {
	it("prints one JSON document with the floor, the in-process and the threaded sender", async () => {
		// A tenth of the default size: the shape is what is checked here, and the default keeps both cores
		// busy for half a minute, slowing every suite running beside it.
		const { stdout } = await run("npm", ["run", "-s", "bench", "--", "sender"], { cwd: path.join(__dirname, ".."), env: { ...process.env, BENCH_SENDER_REQUESTS: "2000" }, maxBuffer: 1 << 20 });
		const { sender } = JSON.parse(stdout) as { sender: Record<string, { requests: number; answered: number; requests_per_s: number; cpu_us_per_request: number; cpu_vs_floor?: number }> & { error?: string } };
		expect(sender.error).toBeUndefined();
		for (const name of ["floor", "in_process", "threaded"]) {
			expect(sender[name].requests).toBe(2000);
			expect(sender[name].answered).toBe(sender[name].requests);
			expect(sender[name].requests_per_s).toBeGreaterThan(0);
			expect(sender[name].cpu_us_per_request).toBeGreaterThan(0);
		}
		expect(sender.in_process.cpu_vs_floor).toBeGreaterThan(0);
		expect(sender.threaded.cpu_vs_floor).toBeGreaterThan(0);
	}, 120_000);
});
