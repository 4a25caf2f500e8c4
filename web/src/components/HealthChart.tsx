// The webhook's health over the last 24 hours: deliveries per hour, succeeded / failed / pending,
// as stacked SVG bars, with the same figures as a table for screen readers and keyboard users.
import type { StatsBucket, WebhookStats } from "../types";
import { formatHour } from "./common";

const SERIES = [
	{ key: "succeeded", label: "Succeeded", class: "bar-ok" },
	{ key: "failed", label: "Failed", class: "bar-failed" },
	{ key: "pending", label: "Pending", class: "bar-pending" },
] as const;

const WIDTH = 480;
const HEIGHT = 120;
const GAP = 2;

export function HealthChart(props: { stats: WebhookStats }) {
	const { buckets, totals } = props.stats;
	const height = (bucket: StatsBucket) => bucket.succeeded + bucket.failed + bucket.pending;
	const max = Math.max(1, ...buckets.map(height));
	const barWidth = WIDTH / buckets.length - GAP;
	const summary = `Last 24 hours: ${totals.succeeded} succeeded, ${totals.failed} failed, ${totals.pending} pending; ${totals.attempts_failed} failed attempts.`;
	return (
		<figure class="chart">
			<svg viewBox={`0 0 ${WIDTH} ${HEIGHT + 1}`} role="img" aria-label={summary} preserveAspectRatio="none">
				<line x1="0" x2={WIDTH} y1={HEIGHT} y2={HEIGHT} class="axis" />
				{buckets.map((bucket, index) => {
					let y = HEIGHT;
					const x = index * (barWidth + GAP);
					return (
						<g key={bucket.start}>
							{SERIES.map(series => {
								const value = bucket[series.key];
								if (!value) return null;
								const h = (value / max) * (HEIGHT - 4);
								y -= h;
								return <rect key={series.key} x={x} y={y} width={barWidth} height={h} class={series.class} />;
							})}
						</g>
					);
				})}
			</svg>
			<div class="ticks" aria-hidden="true">
				<span>{formatHour(buckets[0].start)}</span>
				<span>now</span>
			</div>
			<figcaption>
				<ul class="legend">
					{SERIES.map(series => (
						<li key={series.key}>
							<span class={`swatch ${series.class}`} aria-hidden="true" /> {series.label}: {totals[series.key]}
						</li>
					))}
					<li>Failed attempts: {totals.attempts_failed}</li>
				</ul>
			</figcaption>
			<details>
				<summary>Show the figures per hour</summary>
				<div class="table-wrap">
					<table class="per-hour">
						<caption class="visually-hidden">Deliveries per hour, last 24 hours</caption>
						<thead>
							<tr>
								<th scope="col">Hour</th>
								<th scope="col">Succeeded</th>
								<th scope="col">Failed</th>
								<th scope="col">Pending</th>
								<th scope="col">Failed attempts</th>
							</tr>
						</thead>
						<tbody>
							{buckets
								.filter(bucket => height(bucket) + bucket.attempts_failed + bucket.attempts_succeeded > 0)
								.map(bucket => (
									<tr key={bucket.start}>
										<th scope="row">{formatHour(bucket.start)}</th>
										<td data-label="Succeeded">{bucket.succeeded}</td>
										<td data-label="Failed">{bucket.failed}</td>
										<td data-label="Pending">{bucket.pending}</td>
										<td data-label="Failed attempts">{bucket.attempts_failed}</td>
									</tr>
								))}
						</tbody>
					</table>
				</div>
			</details>
		</figure>
	);
}
