// A webhook's delivery log: newest first, filterable by status, each delivery's attempts on
// demand (time, status code, duration, error kind) and a retry button. A delivery that waits for
// an earlier status of its order (ordering per order) links to that delivery instead of a time.
import { useEffect, useState } from "preact/hooks";
import { Api, ApiError } from "../api";
import { Feedback, formatTime } from "./common";
import type { Delivery, DeliveryWithAttempts } from "../types";

type Page = { deliveries: Delivery[]; links: Array<{ rel: string; href: string }> };

const ERROR_KINDS: Record<string, string> = { http_status: "HTTP status", timeout: "Timeout", unreachable: "Unreachable", blocked: "Blocked" };

/** The server's order (created_at, then id, newest first), for a list that also holds a delivery fetched on its own. */
const newestFirst = (a: Delivery, b: Delivery) => (a.created_at === b.created_at ? (a.id < b.id ? 1 : -1) : a.created_at < b.created_at ? 1 : -1);

const rowId = (deliveryId: string) => `delivery-${deliveryId}`;

export function DeliveryLog(props: { api: Api; webhookId: string; refreshKey: number; onChange: () => void }) {
	const { api, webhookId } = props;
	const [status, setStatus] = useState("");
	const [deliveries, setDeliveries] = useState<Delivery[] | null>(null);
	const [next, setNext] = useState<string | null>(null);
	const [open, setOpen] = useState<Record<string, DeliveryWithAttempts>>({});
	const [error, setError] = useState<ApiError | null>(null);
	const [announcement, setAnnouncement] = useState("");

	const base = `/webhooks/${webhookId}/deliveries?per_page=20${status ? `&status=${status}` : ""}`;
	const load = async (more?: string) => {
		try {
			const page = await api.get<Page>(more ?? base);
			setDeliveries(current => {
				if (!more || !current) return page.deliveries;
				// An earlier delivery shown through a "waiting for" link may come again in an older page.
				const fresh = new Set(page.deliveries.map(delivery => delivery.id));
				return [...current.filter(delivery => !fresh.has(delivery.id)), ...page.deliveries].sort(newestFirst);
			});
			const link = page.links.find(item => item.rel === "next");
			setNext(link ? link.href.replace(/^\/id\/v3/, "") : null);
			setError(null);
		} catch (err) {
			if (err instanceof ApiError) setError(err);
		}
	};
	useEffect(() => void load(), [base, props.refreshKey]);

	const showAttempts = async (delivery: Delivery) => {
		if (open[delivery.id]) {
			const { [delivery.id]: _closed, ...rest } = open;
			setOpen(rest);
			return;
		}
		try {
			const detail = await api.get<DeliveryWithAttempts>(`/webhooks/${webhookId}/deliveries/${delivery.id}`);
			setOpen({ ...open, [delivery.id]: detail });
		} catch (err) {
			if (err instanceof ApiError) setError(err);
		}
	};

	/** Brings the delivery a waiting one waits for into view, with its attempts, fetching it when it is on an older page. */
	const showEarlier = async (event: MouseEvent, earlierId: string) => {
		if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
		event.preventDefault();
		try {
			const detail = open[earlierId] ?? (await api.get<DeliveryWithAttempts>(`/webhooks/${webhookId}/deliveries/${earlierId}`));
			setDeliveries(current => (current && !current.some(delivery => delivery.id === earlierId) ? [...current, detail].sort(newestFirst) : current));
			setOpen(current => ({ ...current, [earlierId]: detail }));
			requestAnimationFrame(() => document.getElementById(rowId(earlierId))?.focus());
		} catch (err) {
			if (err instanceof ApiError) setError(err);
		}
	};

	const retry = async (delivery: Delivery) => {
		try {
			await api.post<Delivery>(`/webhooks/${webhookId}/deliveries/${delivery.id}/retry`);
			setAnnouncement(`Retry of the delivery from ${formatTime(delivery.created_at)} scheduled now.`);
			const { [delivery.id]: _stale, ...rest } = open;
			setOpen(rest);
			await load();
			props.onChange();
		} catch (err) {
			if (err instanceof ApiError) setError(err);
		}
	};

	return (
		<section aria-labelledby="log-heading" class="card">
			<div class="page-head">
				<h2 id="log-heading">Delivery log</h2>
				<div class="inline-controls">
					<label for="log-status">Status</label>
					<select id="log-status" value={status} onChange={event => setStatus((event.target as HTMLSelectElement).value)}>
						<option value="">All</option>
						<option value="pending">Pending</option>
						<option value="succeeded">Succeeded</option>
						<option value="failed">Failed</option>
						<option value="cancelled">Cancelled</option>
					</select>
					<button type="button" onClick={() => (void load(), props.onChange())}>
						Refresh
					</button>
				</div>
			</div>
			<Feedback error={error} status={announcement} />
			{deliveries && deliveries.length === 0 && <p>No deliveries{status ? ` with status ${status}` : ""} yet. Events this webhook subscribes to will appear here.</p>}
			{deliveries && deliveries.length > 0 && (
				<ol class="deliveries">
					{deliveries.map(delivery => (
						<li key={delivery.id} id={rowId(delivery.id)} tabIndex={-1} class={`delivery status-${delivery.status}`}>
							<div class="delivery-row">
								<span class={`status ${delivery.status}`}>{delivery.status}</span>
								<span class="delivery-type mono">{delivery.type}</span>
								<span>{formatTime(delivery.created_at)}</span>
								<span>
									{delivery.attempt_count} attempt{delivery.attempt_count === 1 ? "" : "s"}
									{delivery.last_status_code !== null ? `, last answer ${delivery.last_status_code}` : delivery.last_error_kind ? `, ${ERROR_KINDS[delivery.last_error_kind]}` : ""}
								</span>
								{delivery.waiting_for ? (
									<span class="hint waiting">
										<a href={`#${rowId(delivery.waiting_for)}`} onClick={event => showEarlier(event, delivery.waiting_for!)}>
											waiting for the earlier status
										</a>
									</span>
								) : (
									delivery.status === "pending" && delivery.next_attempt_at && <span class="hint">next attempt {formatTime(delivery.next_attempt_at)}</span>
								)}
								<span class="row-actions">
									<button type="button" aria-expanded={Boolean(open[delivery.id])} aria-controls={`attempts-${delivery.id}`} onClick={() => showAttempts(delivery)}>
										{open[delivery.id] ? "Hide attempts" : "Attempts"}
									</button>
									{delivery.status !== "cancelled" && (
										<button type="button" onClick={() => retry(delivery)} aria-label={`Retry delivery from ${formatTime(delivery.created_at)}`}>
											Retry
										</button>
									)}
								</span>
							</div>
							{open[delivery.id] && <Attempts id={`attempts-${delivery.id}`} delivery={open[delivery.id]} />}
						</li>
					))}
				</ol>
			)}
			{next && (
				<button type="button" onClick={() => load(next)}>
					Show older deliveries
				</button>
			)}
		</section>
	);
}

function Attempts(props: { id: string; delivery: DeliveryWithAttempts }) {
	const { attempts } = props.delivery;
	return (
		<div id={props.id} class="table-wrap">
			{attempts.length === 0 ? (
				<p class="hint">No attempt yet.</p>
			) : (
				<table class="attempts">
					<caption class="visually-hidden">Attempts of this delivery</caption>
					<thead>
						<tr>
							<th scope="col">#</th>
							<th scope="col">Time</th>
							<th scope="col">Status code</th>
							<th scope="col">Duration</th>
							<th scope="col">Error kind</th>
							<th scope="col">Detail</th>
						</tr>
					</thead>
					<tbody>
						{attempts.map(attempt => (
							<tr key={`${attempt.attempt}-${attempt.attempted_at}`}>
								<td data-label="#">{attempt.attempt}</td>
								<td data-label="Time">{formatTime(attempt.attempted_at)}</td>
								<td data-label="Status code">{attempt.status_code ?? "—"}</td>
								<td data-label="Duration">{attempt.duration_ms} ms</td>
								<td data-label="Error kind">{attempt.success ? "—" : attempt.error_kind ? ERROR_KINDS[attempt.error_kind] : "—"}</td>
								<td data-label="Detail">{attempt.success ? "Delivered" : attempt.detail}</td>
							</tr>
						))}
					</tbody>
				</table>
			)}
		</div>
	);
}
