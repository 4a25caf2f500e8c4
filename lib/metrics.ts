// Prometheus metrics, one registry per broker so that tests can run several brokers in one process.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import type { ServiceBroker } from "moleculer";

const registries = new WeakMap<ServiceBroker, Registry>();

export function metricsOf(broker: ServiceBroker): Registry {
	let registry = registries.get(broker);
	if (!registry) {
		registry = new Registry();
		registries.set(broker, registry);
	}
	return registry;
}

export function enableProcessMetrics(broker: ServiceBroker): void {
	collectDefaultMetrics({ register: metricsOf(broker) });
}

type MetricConstructor<M> = new (config: { name: string; help: string; labelNames?: string[]; registers: Registry[]; buckets?: number[]; collect?: () => unknown }) => M;

function getOrCreate<M>(
	broker: ServiceBroker,
	Kind: MetricConstructor<M>,
	name: string,
	help: string,
	labelNames: string[] = [],
	buckets?: number[],
	collect?: () => unknown,
): M {
	const registry = metricsOf(broker);
	const existing = registry.getSingleMetric(name);
	if (existing) return existing as unknown as M;
	return new Kind({ name, help, labelNames, registers: [registry], ...(buckets ? { buckets } : {}), ...(collect ? { collect } : {}) });
}

export const counter = (broker: ServiceBroker, name: string, help: string, labelNames?: string[]) =>
	getOrCreate<Counter<string>>(broker, Counter as MetricConstructor<Counter<string>>, name, help, labelNames);
export const gauge = (broker: ServiceBroker, name: string, help: string, labelNames?: string[]) =>
	getOrCreate<Gauge<string>>(broker, Gauge as MetricConstructor<Gauge<string>>, name, help, labelNames);
export const histogram = (broker: ServiceBroker, name: string, help: string, labelNames?: string[], buckets?: number[]) =>
	getOrCreate<Histogram<string>>(broker, Histogram as MetricConstructor<Histogram<string>>, name, help, labelNames, buckets);

/**
 * A counter read when Prometheus scrapes, from sources that each count up from their own start
 * (a dispatcher's sender threads): what each source added since the previous scrape is added. A
 * source that started again (a thread that died and was replaced) counts from zero, so the
 * counter never goes down. `read` gives each source's count, or null for one not running.
 */
export const counterReadAtScrape = (broker: ServiceBroker, name: string, help: string, read: () => Promise<Array<number | null>>) => {
	const counted: number[] = [];
	const created: { counter?: Counter<string> } = {};
	created.counter = getOrCreate<Counter<string>>(broker, Counter as MetricConstructor<Counter<string>>, name, help, [], undefined, async () => {
		for (const [source, count] of (await read()).entries()) {
			if (count === null) continue;
			const before = counted[source] ?? 0;
			created.counter!.inc(count >= before ? count - before : count);
			counted[source] = count;
		}
	});
	return created.counter;
};

/** A gauge whose value is read when Prometheus scrapes (`collect` sets it, and may be async). */
export const gaugeReadAtScrape = (broker: ServiceBroker, name: string, help: string, labelNames: string[], collect: (gauge: Gauge<string>) => Promise<void>) => {
	const created: { gauge?: Gauge<string> } = {};
	created.gauge = getOrCreate<Gauge<string>>(broker, Gauge as MetricConstructor<Gauge<string>>, name, help, labelNames, undefined, () => collect(created.gauge!));
	return created.gauge;
};
