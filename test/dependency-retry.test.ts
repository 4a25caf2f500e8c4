// retryOnDependencyFailure: tries again only when a dependency is down, and only while allowed.
import { retryOnDependencyFailure } from "../lib/dependency-retry";

const unavailable = () => Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5432"), { code: "ECONNREFUSED" });

describe("retryOnDependencyFailure", () => {
	const options = { attempts: 3, delayMs: 1, stopping: () => false };

	it("tries again after dependency failures and returns the first success", async () => {
		let calls = 0;
		const result = await retryOnDependencyFailure(async () => {
			calls += 1;
			if (calls < 3) throw unavailable();
			return "stored";
		}, options);
		expect({ result, calls }).toEqual({ result: "stored", calls: 3 });
	});

	it("throws the last dependency failure once the attempts are used up", async () => {
		let calls = 0;
		await expect(
			retryOnDependencyFailure(async () => {
				calls += 1;
				throw unavailable();
			}, options),
		).rejects.toMatchObject({ code: "ECONNREFUSED" });
		expect(calls).toBe(3);
	});

	it("does not retry other errors, nor while the service is stopping", async () => {
		let calls = 0;
		const failing = async () => {
			calls += 1;
			throw calls === 1 ? new Error("a bug") : unavailable();
		};
		await expect(retryOnDependencyFailure(failing, options)).rejects.toThrow("a bug");
		expect(calls).toBe(1);
		await expect(retryOnDependencyFailure(failing, { ...options, stopping: () => true })).rejects.toMatchObject({ code: "ECONNREFUSED" });
		expect(calls).toBe(2);
	});
});
