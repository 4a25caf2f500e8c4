// The order in which jest hands suites to its workers. Jest's own order runs the suites that took
// longest on an earlier run first, so that no long suite starts late and runs alone at the end;
// but that timing lives in jest's cache, which a fresh clone (CI) does not have, and then it
// falls back to file size, which says little here (a 560-line suite of quick requests, a
// 270-line one of process kills). So the suites known to run longest go first, and the rest
// follow in jest's own order.
const Sequencer = require("@jest/test-sequencer").default;

// Longest first, as measured in a parallel run of the whole suite on the 2-core machine, shared
// with other work (2026-11-26: 114 s down to 13 s; jest 455 s in all), dispatcher-api and repl at
// their place after they were sped up (measured alone). The bench scenarios are listed too:
// missing from here, the ordering one (147 s then) started last and ran alone at the end.
const LONGEST = [
	"cluster-faults.test.ts",
	"metrics.test.ts",
	"cluster-ordering.test.ts",
	"dispatcher.test.ts",
	"notifier-crash.test.ts",
	"ordering.test.ts",
	"endpoint-breaker.test.ts",
	"entrypoint.test.ts",
	"dispatcher-instances.test.ts",
	"bench-ordering.test.ts",
	"cluster-http-intake.test.ts",
	"web-app.test.ts",
	"dispatcher-crash.test.ts",
	"compiled-server.test.ts",
	"cluster-integration.test.ts",
	"dispatcher-api.test.ts",
	"repl.test.ts",
	"tracing.test.ts",
	"webhook-lifecycle.test.ts",
	"webhook-recover.test.ts",
	"gateway-hardening.test.ts",
	"cluster-rate-limit.test.ts",
	"token.test.ts",
	"sdk.test.ts",
	"rate-limit.test.ts",
	"bench-ratelimit.test.ts",
	"retention.test.ts",
	"webhook-lifecycle-instances.test.ts",
	"examples.test.ts",
	"notifier-preferences.test.ts",
	"bench-api.test.ts",
	"listen.test.ts",
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
