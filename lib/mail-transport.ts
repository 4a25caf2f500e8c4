// Hands a composed email to nodemailer: over SMTP when SMTP_URL is an smtp(s):// URL, otherwise
// (unset in the embedded default, or `file:` chosen explicitly) into an .eml file under
// DATA_DIR/mail named after the Message-ID, so that a resend of the same email overwrites its
// file instead of adding a second one.
//
// Failures come back as MailSendError, which says whether trying again could help: the outbox
// retries transient failures (no connection, timeouts, 4xx replies) and gives up on permanent
// ones (5xx replies, an address nodemailer cannot use).
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";
import nodemailer from "nodemailer";
import SMTPTransport from "nodemailer/lib/smtp-transport";
import type { ComposedEmail } from "./email-message";
import { MAIL_TO_FILES } from "./config";

export interface MailTransportOptions {
	/** smtp://user:pass@host:587 or smtps://host:465; unset or MAIL_TO_FILES writes .eml files. */
	smtpUrl?: string;
	/** Extra PEM CA to trust for the SMTP server's certificate (e.g. a private relay). */
	caFile?: string;
	/** Where .eml files go when there is no SMTP server. */
	mailDir: string;
	/** Limit for connecting, the greeting and each later step of the SMTP conversation. */
	timeoutMs: number;
}

export interface SendOutcome {
	/** The server's final reply (e.g. "250 2.0.0 queued as …"), or the file written. */
	response: string;
}

export interface MailTransport {
	/** For logs: "smtp://host:port" (never the credentials) or "files in <dir>". */
	readonly description: string;
	send(email: ComposedEmail): Promise<SendOutcome>;
	close(): void;
}

export class MailSendError extends Error {
	constructor(
		message: string,
		readonly permanent: boolean,
		readonly responseCode?: number,
		readonly code?: string,
	) {
		super(message);
		this.name = "MailSendError";
	}
}

interface NodemailerError {
	message?: string;
	code?: string;
	responseCode?: number;
	response?: string;
	command?: string;
}

/**
 * Permanent: a 5xx reply (the server refuses this message for good), or an envelope/message
 * nodemailer itself rejects. Authentication failures stay transient although they are 5xx: they
 * are a configuration mistake that an operator fixes, after which the retries go through.
 */
export function classifySendError(err: unknown): MailSendError {
	if (err instanceof MailSendError) return err;
	const failure = (err ?? {}) as NodemailerError;
	const code = typeof failure.code === "string" ? failure.code : undefined;
	const responseCode = typeof failure.responseCode === "number" ? failure.responseCode : undefined;
	const permanent = (responseCode !== undefined && responseCode >= 500 && code !== "EAUTH") || (responseCode === undefined && (code === "EENVELOPE" || code === "EMESSAGE"));
	const reply = failure.response ? singleLineReply(failure.response) : undefined;
	const summary = [code, failure.command && `at ${failure.command}`, reply ?? failure.message].filter(Boolean).join(" ");
	return new MailSendError(summary || "unknown send failure", permanent, responseCode, code);
}

function singleLineReply(text: string): string {
	return text.replace(/\s+/g, " ").trim().slice(0, 500);
}

function mailOptions(email: ComposedEmail): nodemailer.SendMailOptions {
	return {
		from: email.from,
		to: email.to,
		subject: email.subject,
		text: email.text,
		html: email.html,
		messageId: email.messageId,
		headers: email.headers,
	};
}

/** What the URL says, minus any credentials: safe to log. */
function describeSmtpUrl(smtpUrl: string): string {
	const url = new URL(smtpUrl);
	return `${url.protocol}//${url.hostname}${url.port ? `:${url.port}` : ""}`;
}

function createSmtpTransport(options: MailTransportOptions & { smtpUrl: string }): MailTransport {
	// One connection per message rather than a pool: sends are rare (terminal order statuses of
	// opted-in users), and a message's fate then never depends on another message's connection.
	// SMTPTransport itself, because nodemailer.createTransport({url, ...}) keeps only what the URL
	// says and silently drops every other option (timeouts, the CA).
	const smtpTransport = new SMTPTransport({
		url: options.smtpUrl,
		connectionTimeout: options.timeoutMs,
		greetingTimeout: options.timeoutMs,
		socketTimeout: options.timeoutMs,
		dnsTimeout: options.timeoutMs,
		...(options.caFile ? { tls: { ca: fs.readFileSync(options.caFile) } } : {}),
	});
	const transporter = nodemailer.createTransport(smtpTransport);
	return {
		description: describeSmtpUrl(options.smtpUrl),
		async send(email) {
			try {
				const info = await transporter.sendMail(mailOptions(email));
				if (info.rejected?.length) throw new MailSendError(`recipient rejected: ${singleLineReply(String(info.response ?? ""))}`, true);
				return { response: singleLineReply(String(info.response ?? "")) };
			} catch (err) {
				throw classifySendError(err);
			}
		},
		close() {
			transporter.close();
		},
	};
}

/** The file a Message-ID is written to: `<digest@domain>` -> `digest@domain.eml`. */
export function emlFileName(messageId: string): string {
	return `${messageId.replace(/^<|>$/g, "").replace(/[^\w.@-]/g, "_")}.eml`;
}

function createFileTransport(mailDir: string): MailTransport {
	const transporter = nodemailer.createTransport({ streamTransport: true, buffer: true, newline: "windows" });
	return {
		description: `files in ${mailDir}`,
		async send(email) {
			try {
				const info = await transporter.sendMail(mailOptions(email));
				fs.mkdirSync(mailDir, { recursive: true });
				const target = path.join(mailDir, emlFileName(email.messageId));
				// Write then rename: a reader (or a crash) never sees half a message.
				const temporary = `${target}.${crypto.randomBytes(6).toString("hex")}.tmp`;
				await fs.promises.writeFile(temporary, info.message as Buffer);
				await fs.promises.rename(temporary, target);
				return { response: `written to ${target}` };
			} catch (err) {
				// Disk full or a permission problem: an operator can fix it, so retry.
				throw err instanceof MailSendError ? err : new MailSendError(`could not write the .eml file: ${(err as Error).message}`, false);
			}
		},
		close() {
			transporter.close();
		},
	};
}

export function createMailTransport(options: MailTransportOptions): MailTransport {
	const smtpUrl = options.smtpUrl === MAIL_TO_FILES ? undefined : options.smtpUrl;
	return smtpUrl ? createSmtpTransport({ ...options, smtpUrl }) : createFileTransport(options.mailDir);
}
