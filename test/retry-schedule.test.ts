// The retry schedule: offsets from the first attempt, jitter only earlier, give up after the last.
import { maxAttempts, scheduleNextAttempt } from "../lib/retry-schedule";
import { parseDurationList } from "../lib/durations";

const DEFAULT_OFFSETS = parseDurationList("1m,5m,30m,2h,6h");
const first = new Date("2026-01-01T00:00:00.000Z");
const at = (ms: number) => new Date(first.getTime() + ms);

describe("retry schedule", () => {
	it("gives 5 retries after the first attempt with the default schedule, then gives up", () => {
		expect(maxAttempts(DEFAULT_OFFSETS)).toBe(6);
		const noJitter = () => 0;
		const times = [1, 2, 3, 4, 5].map(attemptsMade =>
			scheduleNextAttempt({ firstAttemptAt: first, attemptsMade, offsets: DEFAULT_OFFSETS, now: at(DEFAULT_OFFSETS[attemptsMade - 2] ?? 0), random: noJitter }),
		);
		expect(times.map(time => time!.getTime() - first.getTime())).toEqual([60_000, 300_000, 1_800_000, 7_200_000, 21_600_000]);
		expect(scheduleNextAttempt({ firstAttemptAt: first, attemptsMade: 6, offsets: DEFAULT_OFFSETS, now: at(21_600_000), random: noJitter })).toBeNull();
	});

	it("counts offsets from the first attempt, not from the previous one", () => {
		// The second attempt ran late (at 3 min instead of 1 min): the third still comes at 5 min.
		const next = scheduleNextAttempt({ firstAttemptAt: first, attemptsMade: 2, offsets: DEFAULT_OFFSETS, now: at(180_000), random: () => 0 });
		expect(next).toEqual(at(300_000));
	});

	it("only ever moves a retry earlier, never before the previous offset, so all retries fall within 6 hours", () => {
		for (const random of [() => 0, () => 0.5, () => 0.999999, () => 1, () => -3, () => Number.NaN]) {
			let previous = 0;
			for (let attemptsMade = 1; attemptsMade <= DEFAULT_OFFSETS.length; attemptsMade++) {
				const now = at(previous);
				const next = scheduleNextAttempt({ firstAttemptAt: first, attemptsMade, offsets: DEFAULT_OFFSETS, now, random })!;
				const offset = next.getTime() - first.getTime();
				expect(offset).toBeLessThanOrEqual(DEFAULT_OFFSETS[attemptsMade - 1]);
				expect(offset).toBeGreaterThanOrEqual(previous);
				expect(offset).toBeLessThanOrEqual(6 * 3_600_000);
				previous = offset;
			}
		}
	});

	it("applies at most 10% of the gap as jitter", () => {
		const next = scheduleNextAttempt({ firstAttemptAt: first, attemptsMade: 2, offsets: DEFAULT_OFFSETS, now: at(60_000), random: () => 0.5 });
		// Gap between 1 min and 5 min is 4 min; half of 10% of it is 12 s.
		expect(next).toEqual(at(300_000 - 12_000));
	});

	it("keeps the schedule's spacing from now when the nominal time has already passed", () => {
		// Parked for a day: the next retry comes one gap (4 min) after now, not immediately.
		const now = at(86_400_000);
		const next = scheduleNextAttempt({ firstAttemptAt: first, attemptsMade: 2, offsets: DEFAULT_OFFSETS, now, random: () => 0 });
		expect(next).toEqual(new Date(now.getTime() + 240_000));
	});

	it("works with compressed test schedules", () => {
		const offsets = parseDurationList("1s,2s,3s,4s,5s");
		const next = scheduleNextAttempt({ firstAttemptAt: first, attemptsMade: 1, offsets, now: at(20), random: () => 0 });
		expect(next).toEqual(at(1_000));
		expect(scheduleNextAttempt({ firstAttemptAt: first, attemptsMade: 6, offsets, now: at(5_000) })).toBeNull();
	});

	it("refuses a nonsensical attempt count", () => {
		expect(() => scheduleNextAttempt({ firstAttemptAt: first, attemptsMade: 0, offsets: DEFAULT_OFFSETS, now: first })).toThrow(/at least 1/);
	});
});
