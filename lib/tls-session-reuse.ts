// New connections to a webhook's origin resume the TLS session of an earlier one. A resumed
// handshake skips the certificate: its chain is not verified here, and the receiver signs
// nothing. undici's connector caches sessions, but a burst opens all of an origin's connections at
// once, before the first has a session to share (its lib/core/connect.js says so). So a cold burst
// paid a full handshake per connection, DELIVERY_WEBHOOK_CONCURRENCY of them per webhook.
//
// Here, while an origin has no session yet, its first connection goes alone. The others wait
// until that session arrives, then connect and resume it. TLS 1.3 sends the session after the
// handshake, a round trip later. They wait no longer than the first connection took to connect
// (or a quarter of a second, if more), so a server that issues no session holds them up once.
//
// Each origin gets a connector of its own. undici keys its session cache by host name alone, so
// two servers on one host (other ports) would otherwise be offered each other's sessions, and
// refuse them.
import type { buildConnector } from "undici";

type Connector = buildConnector.connector;
type ConnectOptions = buildConnector.Options;
type Callback = buildConnector.Callback;

// Origins whose connector (and session) is kept; past this, all are dropped and start over.
const ORIGINS_KEPT = 10_000;
// How long a session counts as known. Servers' session lifetimes are minutes to hours, and a
// session that has expired only costs a full handshake.
const SESSION_KNOWN_MS = 10 * 60_000;
// The least a waiting connection waits for the first one's session. Loopback handshakes take a
// millisecond, but an event loop busy for longer than the wait would let the others go without it.
const MIN_SESSION_WAIT_MS = 250;
// The most they wait for the first connection itself: one that hangs (a dead address among a
// host's) must not hold the others until the connect timeout.
const MAX_FIRST_CONNECT_WAIT_MS = 3_000;

interface OriginState {
	connect: Connector;
	/** When a session last arrived for it (or the wait for one gave up): no waiting until SESSION_KNOWN_MS later. */
	knownAt: number;
	/** Connections waiting for the first one's session; undefined while none is being made. */
	waiting?: Array<() => void>;
}

export class TlsSessionReuse {
	private readonly origins = new Map<string, OriginState>();

	/** `newConnector` builds undici's connector with the sender's options (one per origin). */
	constructor(private readonly newConnector: () => Connector) {}

	connect(options: ConnectOptions, callback: Callback): void {
		const state = this.stateOf(options);
		if (options.protocol !== "https:" || Date.now() - state.knownAt < SESSION_KNOWN_MS) return state.connect(options, callback);
		if (state.waiting) {
			state.waiting.push(() => state.connect(options, callback));
			return;
		}
		const waiting: Array<() => void> = [];
		state.waiting = waiting;
		const started = Date.now();
		const slowFirst = setTimeout(() => this.release(state, waiting, false), MAX_FIRST_CONNECT_WAIT_MS);
		state.connect(options, (...args) => {
			clearTimeout(slowFirst);
			const [error, socket] = args;
			if (error || !socket) {
				this.release(state, waiting, false);
				return callback(...args);
			}
			// undici's own listener, added before this one, has cached the session by then.
			const onSession = () => {
				clearTimeout(timer);
				this.release(state, waiting, true);
			};
			const timer = setTimeout(() => {
				socket.off("session", onSession);
				this.release(state, waiting, true);
			}, Math.max(MIN_SESSION_WAIT_MS, Date.now() - started));
			socket.once("session", onSession);
			callback(...args);
		});
	}

	private stateOf(options: ConnectOptions): OriginState {
		const origin = `${options.protocol}//${options.hostname}:${options.port}`;
		let state = this.origins.get(origin);
		if (!state) {
			if (this.origins.size >= ORIGINS_KEPT) this.origins.clear();
			state = { connect: this.newConnector(), knownAt: 0 };
			this.origins.set(origin, state);
		}
		return state;
	}

	/**
	 * Lets the connections that waited on one first connection go (once: a first connection given
	 * up on may still answer later). `known`: a session arrived, or this origin gives none.
	 */
	private release(state: OriginState, waiting: Array<() => void>, known: boolean): void {
		if (state.waiting === waiting) state.waiting = undefined;
		if (known) state.knownAt = Date.now();
		for (const connect of waiting.splice(0)) connect();
	}
}
