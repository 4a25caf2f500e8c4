// Raw HTTP/1.1 over a TCP socket, for requests that fetch would refuse to send or would repair:
// bad framing, missing or repeated headers, junk between requests.
import net from "node:net";

export interface RawResponse {
	status: number;
	headers: Record<string, string>;
	body: string;
}

/** Splits what a server wrote into its answers (Content-Length or chunked bodies). */
export function parseRawResponses(text: string): RawResponse[] {
	const responses: RawResponse[] = [];
	while (text.startsWith("HTTP/1.1 ")) {
		const headerEnd = text.indexOf("\r\n\r\n");
		const lines = text.slice(0, headerEnd).split("\r\n");
		const headers = Object.fromEntries(lines.slice(1).map(line => [line.slice(0, line.indexOf(":")).toLowerCase(), line.slice(line.indexOf(":") + 1).trim()]));
		let rest = text.slice(headerEnd + 4);
		let body = "";
		if (headers["content-length"] !== undefined) {
			body = rest.slice(0, Number(headers["content-length"]));
			rest = rest.slice(body.length);
		} else if (headers["transfer-encoding"] === "chunked") {
			while (true) {
				const sizeEnd = rest.indexOf("\r\n");
				const size = parseInt(rest.slice(0, sizeEnd), 16);
				body += rest.slice(sizeEnd + 2, sizeEnd + 2 + size);
				rest = rest.slice(sizeEnd + 2 + size + 2);
				if (size === 0) break;
			}
		}
		responses.push({ status: Number(lines[0].split(" ")[1]), headers, body });
		text = rest;
	}
	return responses;
}

/**
 * Writes raw bytes on one connection and parses every answer until the server closes it. A
 * server that keeps the connection open past `waitMs` fails the exchange.
 */
export function rawExchange(baseUrl: string, bytes: string | Buffer, waitMs = 10_000): Promise<RawResponse[]> {
	const { hostname, port } = new URL(baseUrl);
	return new Promise((resolve, reject) => {
		const socket = net.connect({ host: hostname, port: Number(port) }, () => socket.write(bytes));
		const chunks: Buffer[] = [];
		socket.setTimeout(waitMs, () => socket.destroy(new Error("the server kept the connection open")));
		socket.on("data", chunk => chunks.push(chunk));
		socket.on("error", reject);
		socket.on("close", () => resolve(parseRawResponses(Buffer.concat(chunks).toString("utf8"))));
	});
}
