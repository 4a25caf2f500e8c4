// A TCP relay on loopback that a test puts in front of a server (PostgreSQL) so that it can make
// the server unreachable without touching it: cut() refuses new connections and destroys the
// live ones, restore() listens again on the same port and relays as before.
import net from "node:net";

export interface TcpRelay {
	readonly port: number;
	/** Connections relayed so far. */
	readonly connections: number;
	readonly isCut: boolean;
	cut(): Promise<void>;
	restore(): Promise<void>;
	close(): Promise<void>;
}

export async function startTcpRelay(target: { host: string; port: number }): Promise<TcpRelay> {
	const sockets = new Set<net.Socket>();
	let connections = 0;
	let port = 0;
	let server: net.Server | undefined;

	const track = (socket: net.Socket) => {
		sockets.add(socket);
		socket.once("close", () => sockets.delete(socket));
		// A cut destroys both sides; the errors that follow are the point, not a problem.
		socket.on("error", () => socket.destroy());
	};

	function relay(client: net.Socket): void {
		connections += 1;
		track(client);
		const upstream = net.connect(target);
		track(upstream);
		client.pipe(upstream);
		upstream.pipe(client);
		client.once("close", () => upstream.destroy());
		upstream.once("close", () => client.destroy());
	}

	async function listen(): Promise<void> {
		const next = net.createServer(relay);
		await new Promise<void>((resolve, reject) => {
			next.once("error", reject);
			next.listen(port, "127.0.0.1", () => resolve());
		});
		port = (next.address() as net.AddressInfo).port;
		server = next;
	}

	async function stopListening(): Promise<void> {
		const current = server;
		server = undefined;
		for (const socket of sockets) socket.destroy();
		if (current) await new Promise<void>(resolve => current.close(() => resolve()));
	}

	await listen();
	return {
		get port() {
			return port;
		},
		get connections() {
			return connections;
		},
		get isCut() {
			return server === undefined;
		},
		cut: stopListening,
		async restore() {
			if (!server) await listen();
		},
		close: stopListening,
	};
}
