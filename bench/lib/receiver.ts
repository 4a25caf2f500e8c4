// Child process of bench/delivery.ts: the webhook receivers, in a process of their own so that
// they have their own core and event loop, as real receivers would. One HTTPS port per endpoint
// (each its own origin, so each gets its own connection pool in a client): "ok" answers 200 at
// once, "slow" answers 200 after SLOW_MS, "fail" always answers 500. "ordered" (the ordering
// scenario, bench/lib/ordering.ts) reads the body: it answers 500 to a status whose data carries
// `"bench_fail":true` (counted as fail), and otherwise 200 as "ok" does, counting a status that
// arrives after a later one of the same order at the same endpoint (its data's `seq`) as out of
// order.
//
// A path picks another kind on any endpoint, so that webhooks of one host (one port, one origin)
// can behave differently: `/slow` (after SLOW_MS, or `?ms=<n>`), `/fail`, and `/quiet`, which
// answers 200 at once and is counted apart from "ok": a neighbour that is no trouble, beside
// healthy webhooks whose counts and samples it must not join.
//
// For bodies that carry `"sent_at":<ms>` (the monotonic clock, shared by every process on the
// machine), an "ok" endpoint records [sent_at, latency] for the parent. Throughput is counted
// here, by the receiver: "ok" counts distinct message ids (webhook-id) answered 200, so that a
// repeat never stands in for a missing delivery; repeats are counted apart. The counts are pushed
// to the parent every few milliseconds while they change.
import https from "node:https";
import type { AddressInfo } from "node:net";
import { startEventLoopProbe } from "./event-loop-probe";

export type EndpointKind = "ok" | "slow" | "fail" | "ordered" | "quiet";
export const SLOW_MS = 100;
const KINDS_BY_PATH: EndpointKind[] = ["slow", "fail", "quiet"];
// Tested before any parsing: every request of the floor and the healthy webhooks goes through
// behaviourOf, and a URL parse for each was receiver CPU that the raw loop counts.
const KIND_PATH = new RegExp(`^/(${KINDS_BY_PATH.join("|")})(?:[?#]|$)`);

export interface ReceiverReady {
	ports: number[];
}
export type ReceiverMessage = { type: "count"; ok: number; repeats: number; slow: number; fail: number; quiet: number; okBytes: number; outOfOrder: number; connections: number } | { type: "samples"; samples: Array<[number, number]> };

export const monotonicMs = () => Number(process.hrtime.bigint()) / 1e6;

function requestBytes(method = "", url = "", rawHeaders: string[], body: Buffer[]): number {
	let bytes = method.length + url.length + 12; // "POST /p HTTP/1.1\r\n"
	for (let i = 0; i < rawHeaders.length; i += 2) bytes += rawHeaders[i].length + rawHeaders[i + 1].length + 4;
	return bytes + 2 + body.reduce((sum, chunk) => sum + chunk.length, 0);
}

/** What a request to an endpoint of `endpointKind` meets: the kind its path names, if any (see above). */
export function behaviourOf(endpointKind: EndpointKind, url = "/"): { kind: EndpointKind; slowMs: number } {
	const named = KIND_PATH.exec(url);
	if (!named) return { kind: endpointKind, slowMs: SLOW_MS };
	const kind = named[1] as EndpointKind;
	const ms = kind === "slow" ? Number(new URL(url, "https://receiver").searchParams.get("ms")) : NaN;
	return { kind, slowMs: Number.isFinite(ms) && ms > 0 ? ms : SLOW_MS };
}

function main(): void {
	const kinds = (process.env.RECEIVER_ENDPOINTS ?? "ok").split(",") as EndpointKind[];
	const key = process.env.RECEIVER_KEY!;
	const cert = process.env.RECEIVER_CERT!;
	// okBytes: the HTTP request bytes of the "ok" answers (request line, headers, body; not TLS).
	// connections: TLS connections accepted, every endpoint (each costs the client a handshake).
	const counts = { ok: 0, repeats: 0, slow: 0, fail: 0, quiet: 0, okBytes: 0, outOfOrder: 0, connections: 0 };
	const okIds = new Set<string>();
	// "ordered": the highest seq answered 200 per endpoint and order.
	const lastSeq = new Map<string, number>();
	let samples: Array<[number, number]> = [];
	let reported = -1;

	const servers = kinds.map((endpointKind, endpoint) =>
		https.createServer({ key, cert, keepAliveTimeout: 30_000 }, (req, res) => {
			const { kind, slowMs } = behaviourOf(endpointKind, req.url);
			const chunks: Buffer[] = [];
			req.on("data", chunk => chunks.push(chunk));
			req.on("end", () => {
				const arrived = monotonicMs();
				const answer = (status: number) => {
					if (status !== 200) counts.fail += 1;
					else if (kind === "slow") counts.slow += 1;
					else if (kind === "quiet") counts.quiet += 1;
					else if (okIds.has(String(req.headers["webhook-id"]))) counts.repeats += 1;
					else {
						okIds.add(String(req.headers["webhook-id"]));
						counts.ok += 1;
						counts.okBytes += requestBytes(req.method, req.url, req.rawHeaders, chunks);
					}
					res.writeHead(status, { "content-type": "text/plain" });
					res.end(status === 200 ? "ok" : "nope");
				};
				if (kind === "ordered") {
					const { data } = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { data: { order_id: string; seq?: number; sent_at?: number; bench_fail?: boolean } };
					if (data.bench_fail === true) return answer(500);
					if (typeof data.sent_at === "number") samples.push([data.sent_at, arrived - data.sent_at]);
					// A repeat of an earlier status is a repeat, not a status out of order.
					if (typeof data.seq === "number" && !okIds.has(String(req.headers["webhook-id"]))) {
						const key = `${endpoint}\u0000${data.order_id}`;
						if ((lastSeq.get(key) ?? -Infinity) > data.seq) counts.outOfOrder += 1;
						else lastSeq.set(key, data.seq);
					}
					answer(200);
				} else if (kind === "ok") {
					const body = Buffer.concat(chunks).toString("utf8");
					const at = body.indexOf('"sent_at":');
					if (at >= 0) {
						const sentAt = parseFloat(body.slice(at + 10));
						samples.push([sentAt, arrived - sentAt]);
					}
					answer(200);
				} else if (kind === "slow") {
					setTimeout(() => answer(200), slowMs);
				} else if (kind === "quiet") {
					answer(200);
				} else {
					answer(500);
				}
			});
		}),
	);

	let listening = 0;
	for (const server of servers) {
		server.on("secureConnection", () => (counts.connections += 1));
		server.listen(0, "127.0.0.1", () => {
			listening += 1;
			if (listening === servers.length) process.send!({ ports: servers.map(s => (s.address() as AddressInfo).port) } satisfies ReceiverReady);
		});
	}
	setInterval(() => {
		const total = counts.ok + counts.repeats + counts.slow + counts.fail + counts.quiet + counts.outOfOrder + counts.connections;
		if (total === reported) return;
		reported = total;
		process.send!({ type: "count", ...counts } satisfies ReceiverMessage);
	}, 2);
	process.on("message", (message: string) => {
		if (message === "samples") {
			process.send!({ type: "samples", samples } satisfies ReceiverMessage);
			samples = [];
		}
		// Counts are never reset (a count already on its way would undo it); the parent takes differences.
		if (message === "reset") samples = [];
	});
	startEventLoopProbe();
	const stop = () => process.exit(0);
	process.on("SIGTERM", stop);
	process.on("disconnect", stop);
}

if (require.main === module) main();
