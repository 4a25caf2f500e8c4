// Which URLs a webhook may be registered with. This is the check at the door, on the text of
// the URL: HTTPS only, no credentials, no fragment, and no host that is plainly internal (an
// IP literal in a blocked range, or localhost). Host names are resolved and checked again at
// connect time by the dispatcher, because DNS can point anywhere later.
import ipaddr from "ipaddr.js";
import { isBlockedAddress, isIpLiteral, type AllowList } from "./address-ranges";

export const MAX_WEBHOOK_URL_LENGTH = 2048;

export interface UrlCheck {
	/** The normalised URL, or the input as given when it does not parse. */
	url: string;
	/** Empty when the URL may be used. */
	problems: string[];
}

// The WHATWG parser silently drops tabs and newlines inside a URL and trims spaces around it,
// so "https://exa\nmple.com" would quietly become another host: refuse such input outright.
const WHITESPACE_OR_CONTROL = /[\s\p{Cc}]/u;
const SCHEME = /^([a-z][a-z0-9+.-]*):/i;

function rangeName(host: string): string {
	try {
		// ipaddr.js names ranges in camelCase ("carrierGradeNat"): spell them out for people.
		return ipaddr
			.process(host.replace(/^\[|\]$/g, ""))
			.range()
			.replace(/([A-Z])/g, " $1")
			.toLowerCase();
	} catch {
		return "unparseable";
	}
}

function isLocalhostName(hostname: string): boolean {
	const name = hostname.replace(/\.+$/, "");
	return name === "localhost" || name.endsWith(".localhost");
}

/** localhost counts as loopback: usable only where configuration allows a loopback range. */
function loopbackAllowed(allow: AllowList): boolean {
	return !isBlockedAddress("127.0.0.1", allow) || !isBlockedAddress("::1", allow);
}

/**
 * Checks a webhook URL against the registration rules, listing every problem found. Returns
 * the URL in its normalised WHATWG form (lower-case host, punycode, percent-encoding, default port dropped,
 * "/" path when empty): that form is what gets stored and compared for uniqueness.
 */
export function checkWebhookUrl(input: string, allow: AllowList = []): UrlCheck {
	const fail = (...problems: string[]): UrlCheck => ({ url: input, problems });

	if (WHITESPACE_OR_CONTROL.test(input)) return fail("must not contain spaces or control characters");
	const scheme = SCHEME.exec(input)?.[1].toLowerCase();
	if (!scheme) return fail("must be an absolute URL starting with https://");
	if (scheme === "http") return fail("HTTP is not supported: use an https:// URL");
	if (scheme !== "https") return fail(`the ${scheme}: scheme is not supported: use an https:// URL`);
	// "https:host" and "https:///host" parse, but only by guessing; ask for the plain form.
	if (!/^https:\/\/[^/]/i.test(input)) return fail("must be an absolute URL starting with https://");

	let url: URL;
	try {
		url = new URL(input);
	} catch {
		return fail("is not a valid URL");
	}

	const problems: string[] = [];
	if (url.username || url.password) problems.push("must not contain a user name or password");
	// A fragment never reaches the receiver, so accepting one would only mislead.
	if (url.href.includes("#")) problems.push("must not contain a #fragment (it is never sent to the receiver)");
	if (url.port === "0") problems.push("port 0 cannot be used");

	const host = url.hostname;
	if (isIpLiteral(host)) {
		if (isBlockedAddress(host, allow)) {
			problems.push(`must not point to ${host}: ${rangeName(host)} addresses cannot receive webhooks`);
		}
	} else if (isLocalhostName(host) && !loopbackAllowed(allow)) {
		problems.push(`must not point to ${host}: loopback hosts cannot receive webhooks`);
	}

	if (url.href.length > MAX_WEBHOOK_URL_LENGTH) {
		problems.push(`must be at most ${MAX_WEBHOOK_URL_LENGTH} characters once normalised (it has ${url.href.length})`);
	}
	return { url: url.href, problems };
}
