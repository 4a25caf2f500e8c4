// `npm run replay-dead-letters`: sends every event kept in the dead-letter stream back to the
// intake channel, then removes it from the dead-letter stream. Run it with the cluster's
// TRANSPORTER and NAMESPACE once whatever made the consumers give up (usually a long database
// outage) is mended. A replayed event carries the event_id it had, so the consumer group that
// had already persisted it sees a repeat and skips it.
import { ConfigError, parseConfig } from "../lib/config";
import { intakeNames } from "../lib/intake-channel";
import { connectToNats } from "../lib/intake-jetstream";

async function main(): Promise<void> {
	const config = parseConfig(process.env);
	if (!config.TRANSPORTER) throw new ConfigError("Invalid configuration: TRANSPORTER: the cluster's nats:// (or tls://) URL is required");
	const names = intakeNames(config.NAMESPACE);
	const connection = await connectToNats(config.TRANSPORTER, "replay-dead-letters", config);
	try {
		const manager = await connection.jetstreamManager();
		const client = connection.jetstream();
		const { state } = await manager.streams.info(names.deadLetterStream);
		let replayed = 0;
		for (let seq = state.first_seq; state.messages > 0 && seq <= state.last_seq; seq++) {
			const stored = await manager.streams.getMessage(names.deadLetterStream, { seq }).catch(err => {
				if ((err as { code?: string }).code === "404") return undefined; // removed already
				throw err;
			});
			if (!stored) continue;
			// Stored in the intake stream first, removed from the dead letters only then.
			await client.publish(names.subject, stored.data);
			await manager.streams.deleteMessage(names.deadLetterStream, seq);
			replayed += 1;
		}
		process.stdout.write(`Replayed ${replayed} dead-lettered event(s) from ${names.deadLetterStream} to ${names.subject}\n`);
	} finally {
		await connection.close();
	}
}

main().catch(err => {
	process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
	process.exit(err instanceof ConfigError ? 78 : 1);
});
