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

// IANA has allocated only 2000::/3 for global unicast. ipaddr.js calls the unassigned rest
// "unicast" too, including the deprecated IPv4-compatible ::a.b.c.d form (e.g. ::7f00:1, which
// legacy automatic tunnels send to the IPv4 address it carries), so IPv6 must also fall inside it.
const IPV6_GLOBAL_UNICAST = ipaddr.parseCIDR("2000::/3");

function isAllowed(address: Address, allow: AllowList): boolean {
	return allow.some(([range, bits]) => address.kind() === range.kind() && address.match(range, bits));
}

/**
 * True when a connection to this address must be refused. An unparseable address is blocked.
 * IPv4-mapped IPv6 addresses are blocked wherever the IPv4 address they carry is. An IPv4 range
 * in the allow list never exempts them: only an IPv6 range written for them does (e.g.
 * ::ffff:127.0.0.0/104), so allowing 127.0.0.0/8 does not open [::ffff:127.0.0.1].
 */
export function isBlockedAddress(address: string, allow: AllowList = []): boolean {
	let parsed: Address;
	try {
		parsed = ipaddr.parse(normalise(address));
	} catch {
		return true;
	}
	if (isAllowed(parsed, allow)) return false;
	const candidates: Address[] = [parsed];
	if (parsed.kind() === "ipv6" && (parsed as ipaddr.IPv6).isIPv4MappedAddress()) {
		candidates.push((parsed as ipaddr.IPv6).toIPv4Address());
	}
	if (parsed.kind() === "ipv6" && !parsed.match(IPV6_GLOBAL_UNICAST)) return true;
	return candidates.some(candidate => candidate.range() !== "unicast") || parsed.range() !== "unicast";
}
