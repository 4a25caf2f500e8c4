// Retry-After parsing and how it bends the persisted schedule (lib/retry-after.ts).
import { honourRetryAfter, parseRetryAfter } from "../lib/retry-after";

const NOW = new Date("2026-11-21T10:00:00.000Z");
const OFFSETS = [60_000, 300_000, 1_800_000, 7_200_000, 21_600_000];

describe("parseRetryAfter", () => {
	it("reads delay-seconds and HTTP dates", () => {
		expect(parseRetryAfter("2", NOW)).toEqual(new Date("2026-11-21T10:00:02.000Z"));
		expect(parseRetryAfter(" 120 ", NOW)).toEqual(new Date("2026-11-21T10:02:00.000Z"));
		expect(parseRetryAfter("Sat, 21 Nov 2026 10:05:00 GMT", NOW)).toEqual(new Date("2026-11-21T10:05:00.000Z"));
		expect(parseRetryAfter(["30", "60"], NOW)).toEqual(new Date("2026-11-21T10:00:30.000Z"));
	});

	it("ignores what is absent, malformed, zero or already past", () => {
		for (const value of [undefined, "", "0", "-5", "1.5", "soon", "tomorrow", "2026-11-21T10:05:00Z", "Sat, 21 Nov 2026 09:00:00 GMT", "9".repeat(400)]) {
			expect([value, parseRetryAfter(value, NOW)]).toEqual([value, null]);
		}
	});

	it("caps absurd delays at a year, so the date stays valid", () => {
		expect(parseRetryAfter("999999999999", NOW)!.getTime()).toBe(NOW.getTime() + 366 * 86_400_000);
	});
});

describe("honourRetryAfter", () => {
	const first = new Date("2026-11-21T09:59:00.000Z");
	const scheduled = new Date(first.getTime() + 60_000);

	it("keeps the schedule without a Retry-After, or when it asks for less", () => {
		expect(honourRetryAfter(scheduled, null, first, OFFSETS)).toBe(scheduled);
		expect(honourRetryAfter(scheduled, new Date(scheduled.getTime() - 1), first, OFFSETS)).toBe(scheduled);
	});

	it("waits as asked when that stays within the window", () => {
		const asked = new Date(first.getTime() + 3_600_000);
		expect(honourRetryAfter(scheduled, asked, first, OFFSETS)).toEqual(asked);
	});

	it("clamps to the end of the 6-hour window", () => {
		const asked = new Date(first.getTime() + 86_400_000);
		expect(honourRetryAfter(scheduled, asked, first, OFFSETS)).toEqual(new Date(first.getTime() + 21_600_000));
		// A schedule already past the window's end (the service was down) is never pulled earlier.
		const late = new Date(first.getTime() + 30_000_000);
		expect(honourRetryAfter(late, new Date(late.getTime() + 1_000), first, OFFSETS)).toEqual(late);
	});
});
