// The order in which jest hands suites to its workers. Jest's own order runs the suites that took
// longest on an earlier run first, so that no long suite starts late and runs alone at the end;
// but that timing lives in jest's cache, which a fresh clone (CI) does not have, and then it
// falls back to file size, which says little here (a 560-line suite of quick requests, a
// 270-line one of process kills). So the suites known to run longest go first, and the rest
// follow in jest's own order.
const Sequencer = require("@jest/test-sequencer").default;

// Longest first, as measured: the suites over 24 s in a parallel run of the whole suite on the
// 2-core machine (2026-11-26), with the ones sped up since (notifier-crash, cluster-faults, the
// two bench scenarios, quickstart) at their new place, measured alone; then suites known to take
// a while that were under 24 s. The bench scenarios are listed too: missing from here, the
// ordering one (147 s then) started last and ran alone at the end.
const LONGEST = [
	"cluster-faults.test.ts",
	"metrics.test.ts",
	"cluster-ordering.test.ts",
	"dispatcher.test.ts",
	"notifier-crash.test.ts",
	"ordering.test.ts",
	"endpoint-breaker.test.ts",
	"dispatcher-instances.test.ts",
	"bench-ordering.test.ts",
	"entrypoint.test.ts",
	"dispatcher-api.test.ts",
	"repl.test.ts",
	"web-app.test.ts",
	"cluster-http-intake.test.ts",
	"dispatcher-crash.test.ts",
	"tracing.test.ts",
	"cluster-tracing.test.ts",
	"sdk.test.ts",
	"webhook-recover.test.ts",
	"bench-ratelimit.test.ts",
	"quickstart.test.ts",
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
