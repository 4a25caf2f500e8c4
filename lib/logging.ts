// Log lines: JSON in production (one object per line, for a log shipper), a short readable line
// otherwise. Each line written while an action or event handler runs carries the request id
// (ctx.requestID: set by the gateway from X-Request-Id, inherited by every call it causes),
// through an AsyncLocalStorage scope opened by the middleware below. Secrets that could slip into
// a message (webhook secrets, bearer tokens, JWTs) are masked as a last line of defence.
import { AsyncLocalStorage } from "node:async_hooks";
import type { Context, Middleware } from "moleculer";

interface RequestScope {
	requestId: string;
}

const scope = new AsyncLocalStorage<RequestScope>();

/** The request id of the action or event being handled, if any. */
export function currentRequestId(): string | undefined {
	return scope.getStore()?.requestId;
}

// On Node 20 an AsyncLocalStorage in use turns on promise hooks for the whole process, for good:
// every promise then pays for an init call and a before and after call. A dispatcher's delivery
// path runs in no handler (the channel's intake, the sender, the result writes), yet it paid 8 %
// of its main thread for them in a burst once any call had opened a scope. So the store is
// switched off whenever no handler holds a scope open, and the next handler switches it on.
// (Node 24's AsyncLocalStorage needs no promise hooks.)
let openScopes = 0;

function closeScope(): void {
	openScopes -= 1;
	if (openScopes === 0) scope.disable();
}

function withScope<T>(ctx: Context, run: () => T): T {
	if (!ctx.requestID) return run();
	openScopes += 1;
	let result: T;
	try {
		result = scope.run({ requestId: ctx.requestID }, run);
	} catch (err) {
		closeScope();
		throw err;
	}
	if (typeof (result as { then?: unknown } | null)?.then === "function") return Promise.resolve(result).finally(closeScope) as T;
	closeScope();
	return result;
}

/** Opens the request scope around every local action and event handler. */
export const RequestScopeMiddleware: Middleware = {
	name: "RequestScope",
	localAction(next: (ctx: Context) => unknown) {
		return (ctx: Context) => withScope(ctx, () => next(ctx));
	},
	localEvent(next: (ctx: Context) => unknown) {
		return (ctx: Context) => withScope(ctx, () => next(ctx));
	},
} as unknown as Middleware;

const SECRET_PATTERNS: Array<[RegExp, string]> = [
	[/whsec_[A-Za-z0-9+/=]+/g, "whsec_[redacted]"],
	[/\b(Bearer)\s+[A-Za-z0-9._~+/-]+=*/gi, "$1 [redacted]"],
	[/\beyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*/g, "[redacted token]"],
];

export function redactSecrets(text: string): string {
	return SECRET_PATTERNS.reduce((current, [pattern, replacement]) => current.replace(pattern, replacement), text);
}

interface Bindings {
	nodeID?: string;
	ns?: string;
	mod?: string;
	svc?: string;
}

type Formatter = (type: string, args: unknown[], bindings: Bindings, helpers: { printArgs: (args: unknown[]) => unknown[] }) => string[];

/** A moleculer Console logger formatter: JSON lines (production) or readable lines. */
export function logFormatter(json: boolean): Formatter {
	return (type, args, bindings, { printArgs }) => {
		const message = redactSecrets(printArgs(args).map(String).join(" "));
		const requestId = currentRequestId();
		if (json) {
			return [
				JSON.stringify({
					time: new Date().toISOString(),
					level: type,
					msg: message,
					node: bindings.nodeID,
					mod: bindings.svc ?? bindings.mod,
					...(requestId ? { requestId } : {}),
				}),
			];
		}
		const where = `${bindings.nodeID ?? ""}/${(bindings.mod ?? "").toUpperCase()}`;
		return [`[${new Date().toISOString()}] ${type.toUpperCase().padEnd(5)} ${where}:${requestId ? ` [${requestId}]` : ""} ${message}`];
	};
}
