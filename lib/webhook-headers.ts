// Custom request headers per webhook (API.md, "headers"): what a customer may set. Receivers
// often want a static credential or a routing header; we refuse what would let a customer forge
// our signature headers, break framing, reach past the receiver (hop-by-hop headers), or pose as
// a cookie or a proxy's record of the client (Cookie, Forwarded, X-Forwarded-*).
// Values are credentials in practice: the webhooks service encrypts them at rest and only ever
// shows their names.
import { decryptSecret, encryptSecret } from "./crypto";

export const MAX_CUSTOM_HEADERS = 20;
export const MAX_HEADER_VALUE_BYTES = 1024;
export const MAX_HEADER_NAME_LENGTH = 100;

/** RFC 9110 §5.6.2 token characters. */
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

/** Set by the sender itself, or hop-by-hop (RFC 9110 §7.6.1) and meaningless end to end. */
const RESERVED = new Set([
	"content-type",
	"content-length",
	"content-encoding",
	"host",
	"user-agent",
	"connection",
	"keep-alive",
	"proxy-connection",
	"proxy-authenticate",
	"proxy-authorization",
	"te",
	"trailer",
	"transfer-encoding",
	"upgrade",
	"expect",
	"http2-settings",
	// State and proxy headers: a receiver (or a proxy in front of it) would take them as the
	// sender's cookie or as the client address a proxy saw, which a customer must not decide.
	"cookie",
	"set-cookie",
	"forwarded",
	"via",
	"x-real-ip",
	"true-client-ip",
	"cf-connecting-ip",
	"x-client-ip",
	"x-cluster-client-ip",
	"x-original-forwarded-for",
]);

/** Why a header name is refused (a predicate: "header X <problem>"), or undefined when it may be set. */
export function headerNameProblem(name: string): string | undefined {
	if (name.length === 0) return "must not have an empty name";
	if (name.length > MAX_HEADER_NAME_LENGTH) return `must have a name of at most ${MAX_HEADER_NAME_LENGTH} characters`;
	if (!TOKEN.test(name)) return "is not a valid HTTP header name (letters, digits and !#$%&'*+-.^_`|~ only)";
	const lower = name.toLowerCase();
	if (lower.startsWith("webhook-")) return "is reserved: webhook-* headers carry the Standard Webhooks signature and are set by the service";
	if (RESERVED.has(lower) || lower.startsWith("x-forwarded-")) return "is set by the service, or is a hop-by-hop, cookie or proxy header, and cannot be configured";
	return undefined;
}

/** Why a header value is refused, or undefined when it may be sent. */
export function headerValueProblem(value: unknown): string | undefined {
	if (typeof value !== "string") return "must be a string";
	if (Buffer.byteLength(value, "utf8") > MAX_HEADER_VALUE_BYTES) return `must be at most ${MAX_HEADER_VALUE_BYTES} bytes`;
	// CR and LF would split the request (header injection); other controls are refused by HTTP too.
	if (/[\r\n]/.test(value)) return "must not contain CR or LF";
	const codes = [...value].map(char => char.codePointAt(0)!);
	if (codes.some(code => (code < 0x20 && code !== 0x09) || code === 0x7f)) return "must not contain control characters";
	// Characters past Latin-1 have no defined encoding in a header field.
	if (codes.some(code => code > 0xff)) return "must contain only ISO-8859-1 characters (use ASCII)";
	if (value !== value.trim()) return "must not start or end with whitespace";
	return undefined;
}

/** The stored form: names in clear (JSON), values sealed together with the webhook id as AAD. */
export function sealHeaders(headers: Record<string, string>, base64Key: string, webhookId: string): { header_names: string; headers_envelope: string | null } {
	const names = Object.keys(headers);
	return { header_names: JSON.stringify(names), headers_envelope: names.length ? encryptSecret(JSON.stringify(headers), base64Key, webhookId) : null };
}

export function openHeaders(row: { id: string; headers_envelope: string | null }, base64Key: string): Record<string, string> {
	if (!row.headers_envelope) return {};
	try {
		return JSON.parse(decryptSecret(row.headers_envelope, base64Key, row.id)) as Record<string, string>;
	} catch {
		throw new Error(`The custom headers of webhook ${row.id} do not decrypt: is SECRETS_KEY the key they were encrypted with?`);
	}
}
