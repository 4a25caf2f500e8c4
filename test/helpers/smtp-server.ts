// A real SMTP server on loopback (the `smtp-server` package) for the notifier's tests. It parses
// what it accepts with `mailparser`, can be told how to answer each message (accept, 4xx, 5xx),
// can be slow to accept, and can be stopped and restarted on the same port to refuse connections.
//
// A message counts as delivered only if the client is still connected when the server answers
// 250, as with a real MTA: a client killed before that point never handed the message over.
import { setTimeout as sleep } from "node:timers/promises";
import { EventEmitter } from "node:events";
import type { AddressInfo } from "node:net";
import { SMTPServer, type SMTPServerOptions, type SMTPServerSession } from "smtp-server";
import { simpleParser, type ParsedMail } from "mailparser";

export interface ReceivedMail {
	raw: string;
	parsed: ParsedMail;
	messageId: string;
	envelope: { from: string; to: string[] };
	/** Whether the session was encrypted (STARTTLS) and who logged in, if anyone. */
	secure: boolean;
	user: string | undefined;
	receivedAt: Date;
}

/** What the server answers after a message's data: accept, or an SMTP error code and text. */
export type SmtpAnswer = "accept" | { code: number; message: string };

export interface DataAttempt {
	/** 1 for the first time a Message-ID is offered, 2 for the second, … */
	attempt: number;
	messageId: string;
	subject: string;
	to: string[];
}

export interface SmtpServerOptions {
	/** Decides each answer; the default accepts everything. */
	answer?: (attempt: DataAttempt) => SmtpAnswer;
	/** Milliseconds between receiving a message's data and answering it. */
	acceptDelayMs?: number;
	/** Offer STARTTLS with this certificate (otherwise STARTTLS is not offered). */
	tls?: { key: string; cert: string };
	/** Require AUTH with these credentials. */
	auth?: { user: string; pass: string };
}

export interface TestSmtpServer {
	readonly port: number;
	/** smtp://127.0.0.1:<port> */
	readonly url: string;
	/** Messages accepted with 250, in order. */
	readonly received: ReceivedMail[];
	/** Every DATA the server got, whatever it answered. */
	readonly attempts: DataAttempt[];
	/** Messages whose client disconnected before the server answered. */
	readonly abandoned: DataAttempt[];
	/** How many messages' data is being read or awaiting the delayed answer right now. */
	inProgress(): number;
	setAnswer(answer: (attempt: DataAttempt) => SmtpAnswer): void;
	setAcceptDelay(ms: number): void;
	/**
	 * While holding, each message's answer waits until releaseHeld() or until its client
	 * disconnects (then it is abandoned): a crash mid-send without any race.
	 */
	setHold(hold: boolean): void;
	releaseHeld(): void;
	/** How many messages are waiting for their answer in hold mode. */
	heldCount(): number;
	/** Resolves once `count` messages matching `filter` were accepted (rejects after `timeoutMs`). */
	waitForMessages(count: number, filter?: (mail: ReceivedMail) => boolean, timeoutMs?: number): Promise<ReceivedMail[]>;
	/** Resolves once some message's data is being handled (for crash tests). */
	waitForDataInProgress(timeoutMs?: number): Promise<void>;
	/** Stops listening, so that connections are refused, and drops open connections. */
	stopListening(): Promise<void>;
	/** Listens again on the same port. */
	listen(): Promise<void>;
	close(): Promise<void>;
}

function collect(stream: NodeJS.ReadableStream): Promise<string> {
	return new Promise((resolve, reject) => {
		const chunks: Buffer[] = [];
		stream.on("data", chunk => chunks.push(Buffer.from(chunk)));
		stream.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
		stream.on("error", reject);
	});
}

/** A header of a raw message, unfolded (long headers such as List-Unsubscribe are folded). */
export function headerValue(raw: string, name: string): string {
	const headerBlock = raw.split(/\r?\n\r?\n/, 1)[0].replace(/\r?\n[ \t]+/g, " ");
	const match = new RegExp(`^${name}:[ \\t]*(.*)$`, "im").exec(headerBlock);
	return match ? match[1].trim() : "";
}

export async function startSmtpServer(options: SmtpServerOptions = {}): Promise<TestSmtpServer> {
	let answer = options.answer ?? (() => "accept" as SmtpAnswer);
	let acceptDelayMs = options.acceptDelayMs ?? 0;
	const received: ReceivedMail[] = [];
	const attempts: DataAttempt[] = [];
	const abandoned: DataAttempt[] = [];
	const closedSessions = new Set<string>();
	const offers = new Map<string, number>();
	const events = new EventEmitter();
	let busy = 0;
	let hold = false;
	const held = new Map<string, Array<() => void>>();
	const releaseSession = (sessionId: string) => {
		for (const release of held.get(sessionId) ?? []) release();
		held.delete(sessionId);
	};
	// smtp-server unpipes a message's data stream when its client goes away mid-DATA, and the
	// stream then never ends: its read is ended here instead, or inProgress() stayed above 0 for
	// good (the crash test then waited out its whole 60 s bound for "nothing on its way").
	const cutReads = new Map<string, () => void>();
	const readData = (stream: NodeJS.ReadableStream, sessionId: string) =>
		new Promise<string>((resolve, reject) => {
			cutReads.set(sessionId, () => reject(new Error("client went away during DATA")));
			collect(stream).then(resolve, reject);
		}).finally(() => cutReads.delete(sessionId));
	let port = 0;
	let server: SMTPServer | undefined;

	const settings: SMTPServerOptions = {
		logger: false,
		closeTimeout: 200,
		authOptional: !options.auth,
		allowInsecureAuth: true,
		...(options.tls ? { key: options.tls.key, cert: options.tls.cert } : { disabledCommands: ["STARTTLS"] }),
		onAuth(auth, _session, callback) {
			if (options.auth && auth.username === options.auth.user && auth.password === options.auth.pass) return callback(null, { user: auth.username });
			const error = Object.assign(new Error("Invalid username or password"), { responseCode: 535 });
			callback(error);
		},
		onClose(session: SMTPServerSession) {
			closedSessions.add(session.id);
			releaseSession(session.id);
			cutReads.get(session.id)?.();
		},
		onData(stream, session, callback) {
			busy += 1;
			events.emit("data-started");
			void (async () => {
				try {
					const raw = await readData(stream, session.id);
					const messageId = headerValue(raw, "Message-ID");
					const offer = (offers.get(messageId) ?? 0) + 1;
					offers.set(messageId, offer);
					const attempt: DataAttempt = {
						attempt: offer,
						messageId,
						subject: headerValue(raw, "Subject"),
						to: session.envelope.rcptTo.map(rcpt => rcpt.address),
					};
					attempts.push(attempt);
					if (acceptDelayMs > 0) await sleep(acceptDelayMs);
					if (hold && !closedSessions.has(session.id)) {
						await new Promise<void>(resolve => held.set(session.id, [...(held.get(session.id) ?? []), resolve]));
					}
					if (closedSessions.has(session.id)) {
						abandoned.push(attempt);
						return callback(new Error("client went away"));
					}
					const decision = answer(attempt);
					if (decision !== "accept") {
						return callback(Object.assign(new Error(decision.message), { responseCode: decision.code }));
					}
					const mail: ReceivedMail = {
						raw,
						parsed: await simpleParser(raw),
						messageId,
						envelope: { from: session.envelope.mailFrom ? session.envelope.mailFrom.address : "", to: attempt.to },
						secure: session.secure,
						user: typeof session.user === "string" ? session.user : undefined,
						receivedAt: new Date(),
					};
					received.push(mail);
					callback(null, `queued as ${received.length}`);
					events.emit("received", mail);
				} catch (err) {
					callback(err as Error);
				} finally {
					busy -= 1;
				}
			})();
		},
	};

	async function listen(): Promise<void> {
		server = new SMTPServer(settings);
		server.on("error", () => undefined);
		await new Promise<void>((resolve, reject) => {
			server!.server.once("error", reject);
			server!.listen(port, "127.0.0.1", () => resolve());
		});
		port = (server.server.address() as AddressInfo).port;
	}

	async function stopListening(): Promise<void> {
		const current = server;
		server = undefined;
		if (current) await new Promise<void>(resolve => current.close(() => resolve()));
	}

	await listen();

	return {
		get port() {
			return port;
		},
		get url() {
			return `smtp://127.0.0.1:${port}`;
		},
		received,
		attempts,
		abandoned,
		inProgress: () => busy,
		setAnswer(next) {
			answer = next;
		},
		setAcceptDelay(ms) {
			acceptDelayMs = ms;
		},
		setHold(next) {
			hold = next;
		},
		releaseHeld() {
			for (const sessionId of [...held.keys()]) releaseSession(sessionId);
		},
		heldCount: () => [...held.values()].reduce((sum, waiting) => sum + waiting.length, 0),
		waitForMessages(count, filter = () => true, timeoutMs = 30_000) {
			return new Promise((resolve, reject) => {
				const check = () => {
					const matching = received.filter(filter);
					if (matching.length < count) return false;
					cleanup();
					resolve(matching);
					return true;
				};
				const timer = setTimeout(() => {
					cleanup();
					reject(new Error(`SMTP server: expected ${count} matching message(s), got ${received.filter(filter).length} within ${timeoutMs} ms`));
				}, timeoutMs);
				const cleanup = () => {
					clearTimeout(timer);
					events.off("received", check);
				};
				if (!check()) events.on("received", check);
			});
		},
		waitForDataInProgress(timeoutMs = 30_000) {
			if (busy > 0) return Promise.resolve();
			return new Promise((resolve, reject) => {
				const timer = setTimeout(() => reject(new Error("SMTP server: no message data arrived")), timeoutMs);
				events.once("data-started", () => {
					clearTimeout(timer);
					resolve();
				});
			});
		},
		stopListening,
		listen,
		close: stopListening,
	};
}
