// The registration-time URL rules (lib/url-policy.ts), as a pure function: what is accepted,
// how it is normalised, and how configuration widens the allowed ranges.
import { parseAllowList } from "../lib/address-ranges";
import { checkWebhookUrl } from "../lib/url-policy";

describe("webhook URL policy", () => {
	it("accepts public https URLs and normalises them", () => {
		const cases: Array<[string, string]> = [
			["https://hooks.example.com", "https://hooks.example.com/"],
			["https://Hooks.EXAMPLE.com:443/In?A=b", "https://hooks.example.com/In?A=b"],
			["https://hooks.example.com:8443/in", "https://hooks.example.com:8443/in"],
			["https://bücher.example/ä", "https://xn--bcher-kva.example/%C3%A4"],
			["https://8.8.8.8/in", "https://8.8.8.8/in"],
			["https://[2001:4860:4860::8888]/in", "https://[2001:4860:4860::8888]/in"],
			["HTTPS://hooks.example.com/in", "https://hooks.example.com/in"],
		];
		for (const [input, normalised] of cases) expect({ input, ...checkWebhookUrl(input) }).toEqual({ input, url: normalised, problems: [] });
	});

	it("names every problem of a URL, not just the first", () => {
		expect(checkWebhookUrl("https://u:p@10.0.0.1:0/#frag").problems).toEqual([
			"must not contain a user name or password",
			"must not contain a #fragment (it is never sent to the receiver)",
			"port 0 cannot be used",
			"must not point to 10.0.0.1: private addresses cannot receive webhooks",
		]);
	});

	it("judges IP literals in every spelling by the address they denote", () => {
		for (const url of ["https://127.0.0.1/", "https://0177.0.0.1/", "https://0x7f.1/", "https://2130706433/", "https://[::ffff:7f00:1]/", "https://[0:0:0:0:0:ffff:127.0.0.1]/"]) {
			expect({ url, problems: checkWebhookUrl(url).problems }).toEqual({ url, problems: [expect.stringContaining("loopback")] });
		}
	});

	it("lets configuration allow loopback (and with it localhost) but nothing else", () => {
		const loopback = parseAllowList(["127.0.0.0/8", "::1/128"]);
		for (const url of ["https://127.0.0.1:9000/", "https://[::1]/", "https://localhost/", "https://a.b.localhost./"]) {
			expect({ url, problems: checkWebhookUrl(url, loopback).problems }).toEqual({ url, problems: [] });
		}
		for (const url of ["https://10.0.0.1/", "https://169.254.169.254/", "https://[fd00::1]/"]) {
			expect(checkWebhookUrl(url, loopback).problems).toHaveLength(1);
		}
		// Allowing only IPv6 loopback still makes localhost usable, as it may resolve to ::1.
		expect(checkWebhookUrl("https://localhost/", parseAllowList(["::1/128"])).problems).toEqual([]);
		// A private range can be allowed explicitly, e.g. for an on-premises receiver.
		expect(checkWebhookUrl("https://10.20.0.5/", parseAllowList(["10.20.0.0/16"])).problems).toEqual([]);
		expect(checkWebhookUrl("https://localhost/", parseAllowList(["10.20.0.0/16"])).problems).toEqual([expect.stringContaining("loopback")]);
	});

	it("leaves host names that merely look internal to the connect-time check", () => {
		// DNS decides where these point, so only the dispatcher's resolved-address guard can judge them.
		for (const url of ["https://intranet/", "https://metadata.google.internal/", "https://localhost.example.com/"]) {
			expect(checkWebhookUrl(url).problems).toEqual([]);
		}
	});
});
