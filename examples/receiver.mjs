// An HTTPS webhook receiver that verifies each delivery with the SDK's verifyWebhook:
//   npm install @satellite-webhooks/sdk
//   WEBHOOK_SECRET=whsec_… node examples/receiver.mjs
// Deliveries go only to https:// URLs, so it needs a certificate. By default it uses the localhost
// certificate that `npm run listen` keeps under data/listen; set TLS_CERT_FILE and TLS_KEY_FILE
// to use your own.
import { Buffer } from "node:buffer";
import fs from "node:fs";
import https from "node:https";
import { verifyWebhook, WebhookVerificationError } from "@satellite-webhooks/sdk";

// The secret shown once when the webhook was created (or rotated). During a rotation's grace
// period, list both: WEBHOOK_SECRET=whsec_new,whsec_old.
const secrets = (process.env.WEBHOOK_SECRET ?? "").split(",").filter(Boolean);
if (secrets.length === 0) {
	console.error("Set WEBHOOK_SECRET to the webhook's secret (whsec_…)");
	process.exit(64);
}
const port = Number(process.env.PORT ?? 4443);
const host = process.env.HOST ?? "127.0.0.1"; // 0.0.0.0 to take deliveries from other machines
const tls = {
	cert: fs.readFileSync(process.env.TLS_CERT_FILE ?? "data/listen/localhost.pem"),
	key: fs.readFileSync(process.env.TLS_KEY_FILE ?? "data/listen/localhost-key.pem"),
};
// webhook-id repeats on every retry of one delivery: remember the handled ones (a real receiver
// keeps them in its database).
const handled = new Set();

const server = https.createServer(tls, (request, response) => {
	const chunks = [];
	request.on("data", chunk => chunks.push(chunk));
	request.on("end", () => {
		let event;
		try {
			// The raw bytes, exactly as received: parsing and re-serialising would change them.
			event = verifyWebhook(Buffer.concat(chunks), request.headers, secrets);
		} catch (err) {
			const refused = err instanceof WebhookVerificationError;
			console.log(`${refused ? "refused" : "failed"}: ${err.message}`);
			// 400 for a delivery that is not genuine; 500 (retried later) for our own fault.
			response.writeHead(refused ? 400 : 500).end();
			return;
		}
		const id = request.headers["webhook-id"];
		if (!handled.has(id)) {
			handled.add(id);
			console.log(`verified ${event.type} ${id}: ${JSON.stringify(event.data)}`);
		}
		// Only 200 counts as delivered; anything else is retried.
		response.writeHead(200).end();
	});
});

server.listen(port, host, () => console.log(`receiving on https://${host}:${port}/`));
const stop = () => {
	server.close();
	server.closeAllConnections();
};
process.on("SIGINT", stop);
process.on("SIGTERM", stop);
