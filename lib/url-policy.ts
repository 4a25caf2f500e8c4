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

/** Why an IP literal in a blocked range is refused, in words a person can act on. */
function blockedAddressReason(host: string): string {
	let address: ipaddr.IPv4 | ipaddr.IPv6;
	try {
		address = ipaddr.process(host.replace(/^\[|\]$/g, ""));
	} catch {
		return `${host} is not a usable address`;
	}
	// ipaddr.js names ranges in camelCase ("carrierGradeNat"): spell them out for people.
	const range = address.range();
	if (range !== "unicast") return `${range.replace(/([A-Z])/g, " $1").toLowerCase()} addresses cannot receive webhooks`;
	const parts = address.kind() === "ipv6" ? (address as ipaddr.IPv6).parts : [];
	if (parts.length === 8 && parts.slice(0, 6).every(part => part === 0)) {
		const embedded = ipaddr.fromByteArray(address.toByteArray().slice(12)).toString();
		return `it is an IPv4-compatible IPv6 address (the deprecated ::${embedded} form); use ${embedded} or a host name, if that address is public`;
	}
	return "only public addresses can receive webhooks (IPv6 outside the global unicast range 2000::/3)";
}

// One DNS label as it stands after the WHATWG parser (lower case, IDN already in punycode).
// Underscores are tolerated: they are not valid in host names, but real services use them.
const DNS_LABEL = /^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$/;

/** Why a (non-IP) host name is malformed, or undefined. Expects no trailing dot. */
function hostNameProblem(host: string): string | undefined {
	if (host.length > 253) return "the host name is longer than 253 characters";
	const labels = host.split(".");
	if (labels.some(label => label === "")) return `the host name "${host}" has an empty label (".." or a leading or extra trailing dot)`;
	const bad = labels.find(label => !DNS_LABEL.test(label));
	if (bad !== undefined) return `the host name "${host}" is not valid: "${bad}" must be 1 to 63 letters, digits or hyphens, not starting or ending with a hyphen`;
	return undefined;
}

/** The text between "https://" and the path: a "@" there means credentials, even empty ones. */
function authorityOf(input: string): string {
	return input.replace(/^https:\/\//i, "").split(/[/?#\\]/, 1)[0];
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
 * "/" path when empty, no trailing dot on the host): that form is what gets stored and compared
 * for uniqueness.
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
	// "https://:@host/" parses with an empty user and password, which the parser then drops.
	if (url.username || url.password || authorityOf(input).includes("@")) problems.push("must not contain a user name or password");
	// A fragment never reaches the receiver, so accepting one would only mislead.
	if (url.href.includes("#")) problems.push("must not contain a #fragment (it is never sent to the receiver)");
	if (url.port === "0") problems.push("port 0 cannot be used");

	if (isIpLiteral(url.hostname)) {
		const host = url.hostname;
		if (isBlockedAddress(host, allow)) problems.push(`must not point to ${host}: ${blockedAddressReason(host)}`);
	} else {
		// "example.com." and "example.com" are one host: store the form without the final dot.
		if (url.hostname.endsWith(".")) url.hostname = url.hostname.slice(0, -1);
		const host = url.hostname;
		const malformed = hostNameProblem(host);
		if (malformed) problems.push(malformed);
		else if (isLocalhostName(host) && !loopbackAllowed(allow)) problems.push(`must not point to ${host}: loopback hosts cannot receive webhooks`);
	}

	if (url.href.length > MAX_WEBHOOK_URL_LENGTH) {
		problems.push(`must be at most ${MAX_WEBHOOK_URL_LENGTH} characters once normalised (it has ${url.href.length})`);
	}
	return { url: url.href, problems };
}
