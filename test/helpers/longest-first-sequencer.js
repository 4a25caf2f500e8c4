// The order in which jest hands suites to its workers. Jest's own order runs the suites that took
// longest on an earlier run first, so that no long suite starts late and runs alone at the end;
// but that timing lives in jest's cache, which a fresh clone (CI) does not have, and then it
// falls back to file size, which says little here (a 560-line suite of quick requests, a
// 270-line one of process kills). So the suites known to run longest go first, and the rest
// follow in jest's own order.
const Sequencer = require("@jest/test-sequencer").default;

// Longest first, as measured in a parallel run of the whole suite from a fresh clone on the 2-core
// machine (2026-11-26: 167 s down to 24 s; jest 398 s in all).
const LONGEST = [
	"notifier-crash.test.ts",
	"cluster-faults.test.ts",
	"cluster-ordering.test.ts",
	"ordering.test.ts",
	"tracing.test.ts",
	"metrics.test.ts",
	"entrypoint.test.ts",
	"dispatcher.test.ts",
	"endpoint-breaker.test.ts",
	"quickstart.test.ts",
	"dispatcher-instances.test.ts",
	"cluster-http-intake.test.ts",
	"cluster-tracing.test.ts",
	"dispatcher-api.test.ts",
	"repl.test.ts",
	"dispatcher-crash.test.ts",
	"sdk.test.ts",
	"webhook-recover.test.ts",
];

class LongestFirst extends Sequencer {
	async sort(tests) {
		const ordered = await super.sort(tests);
		const rank = test => {
			const index = LONGEST.findIndex(name => test.path.endsWith(`/test/${name}`));
			return index < 0 ? LONGEST.length : index;
		};
		return ordered.map((test, position) => ({ test, position })).sort((a, b) => rank(a.test) - rank(b.test) || a.position - b.position).map(({ test }) => test);
	}
}

module.exports = LongestFirst;
