// Receiver side: checks a delivery's Standard Webhooks signature and timestamp with the
// `standardwebhooks` library and returns the parsed event; on request, also checks its `data`
// against the JSON Schema the catalogue publishes for its type (with Ajv).
import { Webhook, WebhookVerificationError as LibraryVerificationError } from "standardwebhooks";
import Ajv2020, { type ValidateFunction } from "ajv/dist/2020";
import addFormats from "ajv-formats";
import { WebhookPayloadError, WebhookVerificationError } from "./errors";
import type { WebhookEvent, WebhookEventType } from "./api-types";
import { EVENT_DATA_SCHEMAS } from "./event-schemas";

/** Header bags as node:http (`req.headers`), fetch (`Headers`) or a plain object give them. */
export type HeaderSource = Headers | Record<string, string | string[] | undefined>;

const SIGNED_HEADERS = ["webhook-id", "webhook-timestamp", "webhook-signature"] as const;

function signedHeaders(headers: HeaderSource): Record<string, string> {
	const read = (name: string): string | undefined => {
		if (typeof (headers as Headers).get === "function") return (headers as Headers).get(name) ?? undefined;
		const bag = headers as Record<string, string | string[] | undefined>;
		const key = Object.keys(bag).find(candidate => candidate.toLowerCase() === name);
		const value = key === undefined ? undefined : bag[key];
		return Array.isArray(value) ? value.join(" ") : value;
	};
	const picked: Record<string, string> = {};
	for (const name of SIGNED_HEADERS) {
		const value = read(name);
		if (!value) throw new WebhookVerificationError(`Missing ${name} header`);
		picked[name] = value;
	}
	return picked;
}

export interface VerifyOptions<Type extends WebhookEventType = WebhookEventType> {
	/**
	 * Also check the body: a known `type`, a string `timestamp`, and `data` valid against that
	 * type's JSON Schema (the `schema` of GET /webhooks/events). A signed body that fails throws
	 * WebhookPayloadError. Fields the schema does not name are let through: the service may add some.
	 */
	validate?: boolean;
	/** Accept only these types (others throw WebhookPayloadError); the answer is typed to match. */
	types?: readonly Type[];
}

let validators: Map<string, ValidateFunction> | undefined;

/** Compiled on first use, so that receivers which never validate pay nothing for it. */
function validatorOf(type: string): ValidateFunction | undefined {
	if (!validators) {
		const ajv = new Ajv2020({ allErrors: true });
		addFormats(ajv);
		validators = new Map(Object.entries(EVENT_DATA_SCHEMAS).map(([name, schema]) => [name, ajv.compile(schema)]));
	}
	return validators.get(type);
}

function checkPayload(event: WebhookEvent, options: VerifyOptions): void {
	if (options.types && !options.types.includes(event.type)) throw new WebhookPayloadError(`Unexpected event type ${event.type}`, []);
	if (!options.validate) return;
	const validate = validatorOf(event.type);
	if (!validate) throw new WebhookPayloadError(`Unknown event type ${String(event.type)}`, []);
	const problems: Array<{ path: string; message: string }> = [];
	if (typeof event.timestamp !== "string") problems.push({ path: "/timestamp", message: "must be string" });
	if (!validate(event.data)) for (const error of validate.errors ?? []) problems.push({ path: `/data${error.instancePath}`, message: error.message ?? "is invalid" });
	if (problems.length > 0) throw new WebhookPayloadError(`The ${event.type} body does not match its schema: ${problems.map(problem => `${problem.path} ${problem.message}`).join("; ")}`, problems);
}

/**
 * Verifies a delivery and returns its body, typed by `type`. Pass the raw body exactly as
 * received (parsing and re-serialising JSON changes the bytes). `secret` may be a list: during a
 * rotation, pass the new and the old secret, and a delivery signed with either is accepted.
 * Timestamps more than 5 minutes from now are refused (replay protection).
 *
 * With `options` (`{validate: true}`, `{types: [...]}`), the body is also checked against the
 * schema of its type, and the answer is narrowed to the accepted types.
 *
 * Throws WebhookVerificationError when the delivery must be refused (answer 400), or its subclass
 * WebhookPayloadError when a genuine delivery fails the checks `options` asks for.
 * Deduplicate on the `webhook-id` header: a retry of the same delivery repeats it.
 */
export function verifyWebhook(rawBody: string | Buffer | Uint8Array, headers: HeaderSource, secret: string | readonly string[]): WebhookEvent;
export function verifyWebhook<Type extends WebhookEventType = WebhookEventType>(
	rawBody: string | Buffer | Uint8Array,
	headers: HeaderSource,
	secret: string | readonly string[],
	options: VerifyOptions<Type>,
): Extract<WebhookEvent, { type: Type }>;
export function verifyWebhook(rawBody: string | Buffer | Uint8Array, headers: HeaderSource, secret: string | readonly string[], options: VerifyOptions = {}): WebhookEvent {
	const event = verifySignature(rawBody, headers, secret);
	checkPayload(event, options);
	return event;
}

function verifySignature(rawBody: string | Buffer | Uint8Array, headers: HeaderSource, secret: string | readonly string[]): WebhookEvent {
	const secrets = typeof secret === "string" ? [secret] : [...secret];
	if (secrets.length === 0) throw new TypeError("verifyWebhook needs at least one secret");
	const body = typeof rawBody === "string" ? rawBody : Buffer.from(rawBody);
	const picked = signedHeaders(headers);
	let reason = "No matching signature";
	for (const candidate of secrets) {
		try {
			const event = new Webhook(candidate).verify(body, picked) as WebhookEvent;
			if (!event || typeof event !== "object" || typeof event.type !== "string") throw new WebhookVerificationError("The body is not a webhook event");
			return event;
		} catch (err) {
			if (!(err instanceof LibraryVerificationError)) {
				if (err instanceof WebhookVerificationError) throw err;
				// A wrong-format secret or unparsable JSON: no other secret changes that for the body.
				if (err instanceof SyntaxError) throw new WebhookVerificationError("The body is not valid JSON");
				throw err;
			}
			reason = err.message;
			// The timestamp is checked before any signature: another secret would fail the same way.
			if (/timestamp/i.test(reason)) break;
		}
	}
	throw new WebhookVerificationError(reason);
}
