// Small networking helpers for tests that need a port nothing listens on yet.
import net from "node:net";

// Below Linux's ephemeral range (32768-60999 by default). A port the kernel hands out for
// `listen(0)` comes from that range, and so does the local port of every outgoing connection made
// by the suites running beside this one: a port found free there was once taken by someone's
// connection before the role process told to listen on it started ("PORT: port 40017 is already in
// use", cluster faults 1 and 4 in one CI run).
const FIRST = 20_000;
const COUNT = 12_000;

function listensOn(port: number): Promise<boolean> {
	return new Promise(resolve => {
		const server = net.createServer();
		server.once("error", () => resolve(false));
		server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)));
	});
}

// Each jest worker draws from a slice of its own (the config runs four; eight slices leave room),
// and never hands out the same port twice: a port found free is not bound until the process told
// to listen on it has started, seconds later. Drawn at random from the whole range, two roles of
// one cluster, spawned side by side, now and then got the same port ("PORT: port 22994 is already
// in use by another process" in a CI run's cluster ordering suite).
const SLICES = 8;
const SLICE = Math.floor(COUNT / SLICES);
const sliceStart = FIRST + ((Number(process.env.JEST_WORKER_ID ?? 1) - 1) % SLICES) * SLICE;
const handedOut = new Set<number>();

/** A loopback port that was free a moment ago (for "connection refused" and listener tests). */
export async function freePort(): Promise<number> {
	for (let tries = 0; tries < 100; tries += 1) {
		const port = sliceStart + Math.floor(Math.random() * SLICE);
		if (handedOut.has(port)) continue;
		if (await listensOn(port)) {
			handedOut.add(port);
			return port;
		}
	}
	throw new Error(`no free port found between ${sliceStart} and ${sliceStart + SLICE}`);
}
