// Small networking helpers for tests that need a port nothing listens on yet.
import net from "node:net";

/** A loopback port that was free a moment ago (for "connection refused" and listener tests). */
export function freePort(): Promise<number> {
	return new Promise((resolve, reject) => {
		const server = net.createServer();
		server.once("error", reject);
		server.listen(0, "127.0.0.1", () => {
			const { port } = server.address() as net.AddressInfo;
			server.close(() => resolve(port));
		});
	});
}
