// The bad-neighbour scenario of the delivery benchmark (BENCH_SCENARIOS=neighbours): healthy
// webhooks on SQLite, with and without two neighbours beside them, one answering after 100 ms and
// one always answering 500 with its retries due every 250 ms. The healthy webhooks' throughput and
// steady p99 with the neighbours, against without.
import { deploy, EVENTS, LATENCY_ROUNDS, OFFERED, orderEvent, throughput, WARM_UP_EVENTS } from "./deployment";
import { latencyRound, pooled, type LatencyRound } from "./latency";
import type { Receivers } from "./receivers";
import { ratioOf, round } from "./stats";

// The failing neighbour is retried every 250 ms for a minute: retries are due all the time.
const FAST_RETRIES = Array.from({ length: 240 }, (_, i) => `${(i + 1) * 250}ms`).join(",");

export async function neighboursScenario(healthyUrls: string[], neighbourUrls: string[], caFile: string, receivers: Receivers) {
	const measure = async (withNeighbours: boolean, eventsPerSecond?: number) => {
		const deployment = await deploy({ engine: "sqlite", healthyUrls, neighbourUrls: withNeighbours ? neighbourUrls : [], caFile, env: { DELIVERY_RETRY_SCHEDULE: FAST_RETRIES } });
		try {
			await throughput(deployment, receivers, WARM_UP_EVENTS);
			const slowBefore = receivers.slow;
			const failBefore = receivers.fail;
			const rate = await throughput(deployment, receivers, EVENTS);
			// Counted here: the latency rounds below keep the neighbours answering.
			const neighbourAnswers = { slow: receivers.slow - slowBefore, failing: receivers.fail - failBefore };
			const perSecond = eventsPerSecond ?? (OFFERED ?? rate / 2) / healthyUrls.length;
			// Steady state only, so the rounds can share the deployment.
			const rounds: LatencyRound[] = [];
			for (let turn = 0; turn < LATENCY_ROUNDS; turn++) rounds.push(await latencyRound(deployment.send, orderEvent, deployment.dispatchers, receivers, perSecond, healthyUrls.length));
			const { steady, lost, rounds_p99_ms } = pooled(rounds);
			return { healthy_deliveries_per_s: round(rate), steady, steady_rounds_p99_ms: rounds_p99_ms.steady, lost, neighbour_answers_during_throughput: neighbourAnswers, perSecond };
		} finally {
			await deployment.stop();
		}
	};
	const without = await measure(false);
	const withNeighbours = await measure(true, without.perSecond);
	return {
		healthy_webhooks: healthyUrls.length,
		offered_deliveries_per_s: round(without.perSecond * healthyUrls.length),
		without: { ...without, perSecond: undefined },
		with: { ...withNeighbours, perSecond: undefined },
		healthy_throughput_with_vs_without: ratioOf(withNeighbours.healthy_deliveries_per_s, without.healthy_deliveries_per_s),
		healthy_p99_with_vs_without: ratioOf(withNeighbours.steady.p99_ms, without.steady.p99_ms),
	};
}
