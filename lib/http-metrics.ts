// HTTP metrics of the gateway: requests and their latency by method, route template (the
// alias, e.g. "/id/v3/webhooks/:id", never the raw URL, so ids do not explode the label set)
// and status.
import type { IncomingMessage, ServerResponse } from "node:http";
import type { ServiceBroker } from "moleculer";
import { counter, histogram } from "./metrics";

const METHODS = new Set(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]);
const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

type RoutedRequest = IncomingMessage & { $alias?: { fullPath?: string } };

/** Returns a function that starts observing one request; the figures are recorded when it closes. */
export function httpRequestObserver(broker: ServiceBroker): (req: IncomingMessage, res: ServerResponse) => void {
	const requests = counter(broker, "http_requests_total", "HTTP requests answered by the gateway, by method, route template and status", ["method", "route", "status"]);
	const latency = histogram(
		broker,
		"http_request_duration_seconds",
		"Time from receiving an HTTP request to the end of its answer, by method, route template and status",
		["method", "route", "status"],
		LATENCY_BUCKETS,
	);
	return (req, res) => {
		const started = process.hrtime.bigint();
		res.once("close", () => {
			const alias = (req as RoutedRequest).$alias;
			const labels = {
				method: METHODS.has(req.method ?? "") ? req.method! : "other",
				// Paths that match no route (404s, scanners) share one label.
				route: alias?.fullPath ?? "unmatched",
				status: res.writableFinished ? String(res.statusCode) : "aborted",
			};
			requests.inc(labels);
			latency.observe(labels, Number(process.hrtime.bigint() - started) / 1e9);
		});
	};
}
