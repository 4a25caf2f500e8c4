// Request ids: the gateway honours a caller's X-Request-Id when it is short and made of safe
// characters (it ends up in log lines and headers), and otherwise makes a new one.
import crypto from "node:crypto";

const SAFE_REQUEST_ID = /^[A-Za-z0-9._:@-]{1,64}$/;

/** The caller's id when it is safe to log and echo, else a fresh UUID. */
export function requestIdFrom(header: string | string[] | undefined): string {
	const candidate = Array.isArray(header) ? header[0] : header;
	return candidate !== undefined && SAFE_REQUEST_ID.test(candidate) ? candidate : crypto.randomUUID();
}
