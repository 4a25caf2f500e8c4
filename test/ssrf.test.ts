// The SSRF guard: with an empty allow list every non-public destination is refused as Blocked
// before any packet leaves, whatever form the address takes in the URL. Real TCP listeners on
// the loopback addresses prove that nothing connects; a control run with loopback allowed proves
// the listeners would have seen the connection.
import dns from "node:dns";
import net from "node:net";
import { isBlockedAddress, isIpLiteral, parseAllowList } from "../lib/address-ranges";
import { generateWebhookSecret } from "../lib/crypto";
import { guardedLookup, WebhookSender, type DeliveryRequest } from "../lib/webhook-sender";

interface CountingListener {
	host: string;
	connections: number;
	close(): Promise<void>;
}

function listen(host: string, port: number): Promise<CountingListener> {
	return new Promise((resolve, reject) => {
		const listener: CountingListener = { host, connections: 0, close: () => new Promise(done => server.close(() => done())) };
		const server = net.createServer(socket => {
			listener.connections += 1;
			socket.destroy();
		});
		server.once("error", reject);
		server.listen(port, host, () => resolve(listener));
	});
}

/** One port number held on 127.0.0.1 and, when the machine has IPv6 loopback, on ::1 too. */
async function listenOnLoopback(): Promise<{ port: number; listeners: CountingListener[] }> {
	// Let the kernel pick a free port on 127.0.0.1, then take the same number on ::1; retry on a clash.
	for (let tries = 0; tries < 20; tries++) {
		const server = net.createServer();
		const port = await new Promise<number>((resolve, reject) => {
			server.once("error", reject);
			server.listen(0, "127.0.0.1", () => resolve((server.address() as net.AddressInfo).port));
		});
		await new Promise<void>(done => server.close(() => done()));
		const v4 = await listen("127.0.0.1", port).catch(() => undefined);
		if (!v4) continue;
		const v6 = await listen("::1", port).catch((error: NodeJS.ErrnoException) => (error.code === "EADDRINUSE" ? null : undefined));
		if (v6 === null) {
			await v4.close();
			continue;
		}
		return { port, listeners: v6 ? [v4, v6] : [v4] };
	}
	throw new Error("could not hold one port on both loopback addresses");
}

describe("SSRF guard", () => {
	let port: number;
	let listeners: CountingListener[];
	const secret = generateWebhookSecret();
	const attempt = (url: string): DeliveryRequest => ({ url, messageId: "msg_ssrf", body: "{}", secrets: [secret], timeoutMs: 3_000 });
	const connections = () => listeners.reduce((sum, listener) => sum + listener.connections, 0);
	const hasIpv6Loopback = () => listeners.some(listener => listener.host === "::1");

	beforeAll(async () => {
		({ port, listeners } = await listenOnLoopback());
	});
	afterAll(async () => {
		for (const listener of listeners) await listener.close();
	});

	describe("with an empty allow list", () => {
		let sender: WebhookSender;
		beforeAll(() => {
			sender = new WebhookSender({ allowNets: [] });
		});
		afterAll(() => sender.close());

		const blockedHosts = [
			// loopback, in the forms URL parsing normalises to 127.0.0.1
			"127.0.0.1",
			"127.1",
			"127.0.0.2",
			"127.255.255.254",
			"2130706433",
			"0x7f.0.0.1",
			"0x7f000001",
			"017700000001",
			"0177.0.0.1",
			"127.000.000.001",
			"%31%32%37.0.0.1",
			"127.0.0.1.",
			// host names that resolve to loopback
			"localhost",
			"LOCALHOST",
			// "this host": connecting to 0.0.0.0 or [::] reaches local listeners on Linux
			"0.0.0.0",
			"0",
			"[::]",
			// IPv6 loopback and IPv4 carried in IPv6
			"[::1]",
			"[0:0:0:0:0:0:0:1]",
			"[::ffff:127.0.0.1]",
			"[::ffff:7f00:1]",
			"[::127.0.0.1]",
			"[64:ff9b::7f00:1]",
			"[64:ff9b:1::a00:1]",
			"[2002:7f00:1::1]",
			"[2001::1]",
			"[::ffff:169.254.169.254]",
			"[::ffff:10.0.0.1]",
			// private, link-local, CGNAT, cloud metadata
			"10.0.0.1",
			"10.255.255.255",
			"172.16.0.1",
			"172.31.255.254",
			"192.168.0.1",
			"192.168.255.254",
			"169.254.169.254",
			"169.254.0.1",
			"100.64.0.1",
			"100.127.255.254",
			"[fe80::1]",
			"[fc00::1]",
			"[fd00::1]",
			"[fd00:ec2::254]",
			// multicast, broadcast, reserved and documentation ranges
			"224.0.0.1",
			"239.255.255.250",
			"255.255.255.255",
			"240.0.0.1",
			"192.0.0.1",
			"192.0.2.1",
			"198.18.0.1",
			"198.51.100.1",
			"203.0.113.1",
			"[ff02::1]",
			"[2001:db8::1]",
			"[100::1]",
			"[fec0::1]",
		];

		it(`refuses all ${blockedHosts.length} forms as Blocked, and no connection reaches a listener`, async () => {
			expect(blockedHosts.length).toBeGreaterThanOrEqual(20);
			const notBlocked: string[] = [];
			for (const host of blockedHosts) {
				const outcome = await sender.send(attempt(`https://${host}:${port}/hook`));
				if (outcome.title !== "Blocked" || outcome.errorKind !== "blocked" || outcome.statusCode !== null || outcome.success) {
					notBlocked.push(`${host}: ${outcome.title} ${outcome.detail}`);
				}
			}
			expect(notBlocked).toEqual([]);
			expect(connections()).toBe(0);
		});

		it("refuses loopback on the default HTTPS port too", async () => {
			for (const url of ["https://127.0.0.1/", "https://localhost/", "https://[::1]/"]) {
				expect((await sender.send(attempt(url))).title).toBe("Blocked");
			}
		});

		it("explains the refusal without echoing the resolved address", async () => {
			const outcome = await sender.send(attempt(`https://localhost:${port}/hook`));
			expect(outcome.detail).toMatch(/blocked range/);
			expect(outcome.detail).not.toContain("127.0.0.1");
		});
	});

	describe("control: with loopback allowed, the same listeners do see the connection", () => {
		it("connects to 127.0.0.1, localhost and [::1], which the guard otherwise refuses", async () => {
			const sender = new WebhookSender({ allowNets: ["127.0.0.0/8", "::1/128"] });
			try {
				const before = connections();
				// The listeners are plain TCP and hang up at once: the attempt fails, but it arrived.
				const hosts = hasIpv6Loopback() ? ["127.0.0.1", "localhost", "[::1]"] : ["127.0.0.1", "localhost"];
				for (const host of hosts) {
					const outcome = await sender.send(attempt(`https://${host}:${port}/hook`));
					expect(outcome).toMatchObject({ errorKind: "unreachable", title: "Unreachable" });
				}
				expect(connections() - before).toBe(hosts.length);
			} finally {
				await sender.close();
			}
		});

		it("allowing 127.0.0.0/8 does not open ::1, private ranges or 0.0.0.0", async () => {
			const sender = new WebhookSender({ allowNets: ["127.0.0.0/8"] });
			try {
				for (const host of ["[::1]", "10.0.0.1", "0.0.0.0", "169.254.169.254"]) {
					expect((await sender.send(attempt(`https://${host}:${port}/hook`))).title).toBe("Blocked");
				}
			} finally {
				await sender.close();
			}
		});
	});

	describe("connect-time lookup", () => {
		const allow = parseAllowList([]);
		const resolverAnswering =
			(addresses: dns.LookupAddress[]) =>
			(_hostname: string, _options: dns.LookupAllOptions, callback: (error: NodeJS.ErrnoException | null, addresses: dns.LookupAddress[]) => void) =>
				callback(null, addresses);
		const run = (lookup: ReturnType<typeof guardedLookup>, all: boolean) =>
			new Promise<{ error: NodeJS.ErrnoException | null; address: unknown; family?: number }>(resolve =>
				lookup("hooks.example.com", { all }, (error, address, family) => resolve({ error, address, family })),
			);

		// getaddrinfo cannot be pointed at a test DNS server, so these cases feed the guard's
		// lookup a fixed answer: the guard itself is the real code.
		it("refuses the whole answer when any one address is blocked", async () => {
			const lookup = guardedLookup(allow, resolverAnswering([{ address: "93.184.215.14", family: 4 }, { address: "10.0.0.5", family: 4 }]));
			for (const all of [true, false]) {
				const { error } = await run(lookup, all);
				expect(error?.code).toBe("ERR_WEBHOOK_BLOCKED_ADDRESS");
			}
		});

		it("hands net exactly the addresses it checked, in both lookup shapes", async () => {
			const answer = [
				{ address: "2606:4700:4700::1111", family: 6 },
				{ address: "93.184.215.14", family: 4 },
			];
			const lookup = guardedLookup(allow, resolverAnswering(answer));
			expect(await run(lookup, true)).toEqual({ error: null, address: answer, family: undefined });
			expect(await run(lookup, false)).toEqual({ error: null, address: "2606:4700:4700::1111", family: 6 });
		});

		it("passes resolution failures through and treats an empty answer as not found", async () => {
			const failing = guardedLookup(allow, (_h, _o, callback) => callback(Object.assign(new Error("nope"), { code: "ENOTFOUND" }), []));
			expect((await run(failing, true)).error?.code).toBe("ENOTFOUND");
			expect((await run(guardedLookup(allow, resolverAnswering([])), true)).error?.code).toBe("ENOTFOUND");
		});
	});
});

describe("address ranges (lib/address-ranges.ts)", () => {
	const blocked = [
		["loopback", ["127.0.0.1", "127.255.255.255", "::1"]],
		["unspecified", ["0.0.0.0", "0.1.2.3", "::"]],
		["private (RFC 1918)", ["10.0.0.0", "10.255.255.255", "172.16.0.0", "172.31.255.255", "192.168.0.0", "192.168.255.255"]],
		["link-local and cloud metadata", ["169.254.0.1", "169.254.169.254", "fe80::1", "fe80::a9fe:a9fe"]],
		["carrier-grade NAT", ["100.64.0.0", "100.127.255.255"]],
		["multicast and broadcast", ["224.0.0.1", "239.255.255.255", "255.255.255.255", "ff02::1", "ff0e::1"]],
		["reserved and documentation", ["240.0.0.1", "192.0.0.8", "192.0.2.1", "198.18.0.1", "198.19.255.255", "198.51.100.1", "203.0.113.1", "2001:db8::1", "100::1", "fec0::1"]],
		["IPv4-mapped IPv6", ["::ffff:127.0.0.1", "::ffff:7f00:1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::ffff:8.8.8.8"]],
		["NAT64", ["64:ff9b::7f00:1", "64:ff9b::808:808", "64:ff9b:1::1"]],
		["6to4 and Teredo", ["2002:7f00:1::1", "2002:808:808::1", "2001::1", "2001:0:4136:e378::1"]],
		["unique-local", ["fc00::1", "fd00::1", "fd00:ec2::254"]],
		["IPv6 zones and brackets", ["[::1]", "fe80::1%eth0", "[fe80::1%25eth0]"]],
		["IPv6 outside global unicast (2000::/3), IPv4-compatible included", ["::2", "::7f00:1", "::127.0.0.1", "::a00:1", "4000::1", "e000::1"]],
		["not an address", ["", "localhost", "example.com", "::g", "256.0.0.1", "1.2.3.4.5"]],
	] as const;

	it.each(blocked)("blocks %s", (_range, addresses) => {
		for (const address of addresses) expect([address, isBlockedAddress(address)]).toEqual([address, true]);
	});

	it("lets public unicast through", () => {
		for (const address of ["8.8.8.8", "1.1.1.1", "93.184.215.14", "172.15.255.255", "172.32.0.1", "100.63.255.255", "100.128.0.1", "11.0.0.1", "192.169.0.1", "169.255.0.1", "2606:4700:4700::1111", "2a00:1450:4001:80b::200e", "[2001:4860:4860::8888]"]) {
			expect([address, isBlockedAddress(address)]).toEqual([address, false]);
		}
	});

	it("exempts exactly the allowed ranges", () => {
		const allow = parseAllowList(["127.0.0.0/8", "::1/128", "10.1.0.0/16"]);
		for (const address of ["127.0.0.1", "127.9.9.9", "::1", "10.1.2.3"]) {
			expect([address, isBlockedAddress(address, allow)]).toEqual([address, false]);
		}
		// An IPv4 range does not open the IPv4-mapped IPv6 form of its addresses.
		for (const address of ["10.2.0.1", "192.168.1.1", "169.254.169.254", "0.0.0.0", "::", "fe80::1", "::2", "::7f00:1", "::ffff:127.0.0.1", "::ffff:10.1.2.3"]) {
			expect([address, isBlockedAddress(address, allow)]).toEqual([address, true]);
		}
	});

	it("keeps an IPv4 range from matching IPv6 addresses and the other way round", () => {
		expect(isBlockedAddress("::1", parseAllowList(["127.0.0.0/8"]))).toBe(true);
		expect(isBlockedAddress("127.0.0.1", parseAllowList(["::1/128"]))).toBe(true);
		expect(isBlockedAddress("127.0.0.1", parseAllowList(["::/0"]))).toBe(true);
	});

	it("parses CIDR lists and rejects anything else with the bad entry named", () => {
		expect(parseAllowList([])).toEqual([]);
		expect(parseAllowList(["127.0.0.0/8", "::1/128"])).toHaveLength(2);
		for (const bad of ["127.0.0.1", "127.0.0.0/33", "::1/129", "localhost/8", "10.0.0.0/8/8", ""]) {
			expect(() => parseAllowList([bad])).toThrow(`"${bad}" is not a CIDR range`);
		}
	});

	it("recognises IP literals, bracketed or not", () => {
		for (const host of ["127.0.0.1", "::1", "[::1]", "[fe80::1%25eth0]", "0.0.0.0"]) expect([host, isIpLiteral(host)]).toEqual([host, true]);
		for (const host of ["localhost", "example.com", "1.2.3.4.example.com"]) expect([host, isIpLiteral(host)]).toEqual([host, false]);
	});
});
