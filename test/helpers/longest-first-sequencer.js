// The order in which jest hands suites to its workers. Jest's own order runs the suites that took
// longest on an earlier run first, so that no long suite starts late and runs alone at the end;
// but that timing lives in jest's cache, which a fresh clone (CI) does not have, and then it
// falls back to file size, which says little here (a 560-line suite of quick requests, a
// 270-line one of process kills). So the suites known to run longest go first, and the rest
// follow in jest's own order.
const Sequencer = require("@jest/test-sequencer").default;

// Longest first, as measured in a parallel run of the whole suite on the 2-core machine
// (2026-12-05: 126 s down to 24 s; jest 608 s in all). The bench scenarios are listed too: the
// signal one (55 s) started last in that run and ran nearly alone at the end.
const LONGEST = [
	"entrypoint.test.ts",
	"cluster-faults.test.ts",
	"bench-ordering.test.ts",
	"notifier-crash.test.ts",
	"web-app.test.ts",
	"dispatcher.test.ts",
	"dispatcher-crash.test.ts",
	"cluster-ordering.test.ts",
	"compiled-server.test.ts",
	"cluster-http-intake.test.ts",
	"ordering.test.ts",
	"bench-signal.test.ts",
	"repl.test.ts",
	"dispatcher-instances.test.ts",
	"metrics.test.ts",
	"token.test.ts",
	"gateway-hardening.test.ts",
	"sdk.test.ts",
	"dispatcher-api.test.ts",
	"tracing.test.ts",
	"examples.test.ts",
	"cluster-integration.test.ts",
	"bench-ratelimit.test.ts",
	"endpoint-breaker.test.ts",
	"webhook-lifecycle.test.ts",
	"webhook-recover.test.ts",
	"cluster-rate-limit.test.ts",
	"webhooks-bad-input.test.ts",
	"listen.test.ts",
	"intake.test.ts",
	"bench-api.test.ts",
	"probe-round-two.test.ts",
	"http-intake.test.ts",
	"webhooks.test.ts",
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
