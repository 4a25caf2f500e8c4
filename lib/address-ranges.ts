// Which IP addresses a webhook may reach. Everything that is not plain public unicast is
// blocked: loopback, private, link-local (cloud metadata), CGNAT, multicast, reserved and
// documentation ranges, IPv4-mapped IPv6, NAT64, 6to4, Teredo, unique-local, ... ipaddr.js
// classifies the ranges; configuration (WEBHOOK_ALLOW_NETS) may exempt some, e.g. loopback
// for local tests.
import ipaddr from "ipaddr.js";

type Address = ipaddr.IPv4 | ipaddr.IPv6;
export type AllowList = Array<[Address, number]>;

/** Parses WEBHOOK_ALLOW_NETS entries ("127.0.0.0/8", "::1/128"). Throws on a bad entry. */
export function parseAllowList(cidrs: string[]): AllowList {
	return cidrs.map(cidr => {
		try {
			return ipaddr.parseCIDR(cidr);
		} catch {
			throw new Error(`"${cidr}" is not a CIDR range`);
		}
	});
}

/** Strips brackets and an IPv6 zone ("[fe80::1%eth0]" → "fe80::1"). */
function normalise(address: string): string {
	return address.replace(/^\[|\]$/g, "").replace(/%.*$/, "");
}

export function isIpLiteral(host: string): boolean {
	return ipaddr.isValid(normalise(host));
}

function isAllowed(address: Address, allow: AllowList): boolean {
	return allow.some(([range, bits]) => address.kind() === range.kind() && address.match(range, bits));
}

/**
 * True when a connection to this address must be refused. An unparseable address is blocked.
 * IPv4-mapped/compatible IPv6 addresses are judged as the IPv4 address they carry.
 */
export function isBlockedAddress(address: string, allow: AllowList = []): boolean {
	let parsed: Address;
	try {
		parsed = ipaddr.parse(normalise(address));
	} catch {
		return true;
	}
	const candidates: Address[] = [parsed];
	if (parsed.kind() === "ipv6" && (parsed as ipaddr.IPv6).isIPv4MappedAddress()) {
		candidates.push((parsed as ipaddr.IPv6).toIPv4Address());
	}
	if (candidates.some(candidate => isAllowed(candidate, allow))) return false;
	return candidates.some(candidate => candidate.range() !== "unicast") || parsed.range() !== "unicast";
}
