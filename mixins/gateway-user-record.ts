// The gateway's refresh of the caller's user record, mixed into the api service: the verified
// token's claims go to `users.touch` only for a request that gets a success answer, so that a
// refusal writes nothing. The front door (mixins/gateway-front-door.ts) calls `beforeAction`
// once the request is accepted; the API route's onAfterCall calls `refreshUserAfterSuccess`.
import type { IncomingMessage } from "node:http";
import type { Context, Service, ServiceSchema, ServiceSettingSchema } from "moleculer";
import type { Principal } from "../lib/auth";
import { OPERATIONS } from "../lib/openapi";

// Refreshing the user record on every request would cost a write each time: remember what we
// last sent to `users.touch` and skip identical claims for a while.
const TOUCH_CACHE_TTL_MS = 60_000;
const TOUCH_CACHE_MAX = 10_000;

// The actions that show the caller's user record: it is refreshed before they run.
const USER_RECORD_ACTIONS = new Set(["users.details", "users.updateSettings"]);
const PARAMS_BY_ACTION = new Map(OPERATIONS.filter(operation => operation.params).map(operation => [operation.action, operation.params!]));

export type UserRecordRequest = IncomingMessage & {
	$ctx: Context<unknown, { principal?: Principal }>;
	/** Set once the request is accepted: the user record is refreshed if its action succeeds. */
	$touchAfterSuccess?: boolean;
};

/** What this mixin adds to the service. */
export interface UserRecordMethods {
	touchedUsers: Map<string, { fingerprint: string; at: number }>;
	beforeAction(req: UserRecordRequest, actionName: string, params: Record<string, unknown>): Promise<void>;
	refreshUserAfterSuccess(ctx: Context<unknown, { principal?: Principal }>, req: UserRecordRequest): Promise<void>;
	touchDue(principal: Principal): boolean;
	touchUser(ctx: Context, principal: Principal): Promise<void>;
}

type UserRecordThis = Service & UserRecordMethods;

function touchFingerprint(principal: Principal): string {
	return JSON.stringify([principal.customerId, principal.name, principal.email, principal.lastLogin]);
}

const schema: Partial<ServiceSchema<ServiceSettingSchema, UserRecordThis>> = {
	methods: {
		/**
		 * The user record is refreshed from the token only for a request that gets a success
		 * answer, so that a refusal writes nothing: after the action, except for the actions that
		 * show the record, which run once their params pass their own schema.
		 */
		async beforeAction(this: UserRecordThis, req: UserRecordRequest, actionName: string, params: Record<string, unknown>): Promise<void> {
			const principal = req.$ctx.meta.principal;
			if (!principal || !this.touchDue(principal)) return;
			if (!USER_RECORD_ACTIONS.has(actionName)) {
				req.$touchAfterSuccess = true;
				return;
			}
			// The action will refuse these params (422): it must find the record as it was.
			if (PARAMS_BY_ACTION.get(actionName)?.safeParse(params).success === false) return;
			await this.touchUser(req.$ctx, principal);
		},

		/**
		 * The action's change is made: a failure to refresh the user record must not turn its
		 * answer into an error, and the next request tries again.
		 */
		async refreshUserAfterSuccess(this: UserRecordThis, ctx: Context<unknown, { principal?: Principal }>, req: UserRecordRequest): Promise<void> {
			if (req.$touchAfterSuccess) await this.touchUser(ctx, ctx.meta.principal!).catch(err => this.logger.warn("The user record was not refreshed", err));
		},

		/** False while the same claims were sent to users.touch a moment ago (no write would follow). */
		touchDue(this: UserRecordThis, principal: Principal): boolean {
			const seen = this.touchedUsers.get(principal.userId);
			return !(seen && seen.fingerprint === touchFingerprint(principal) && Date.now() - seen.at < TOUCH_CACHE_TTL_MS);
		},

		async touchUser(this: UserRecordThis, ctx: Context, principal: Principal): Promise<void> {
			const fingerprint = touchFingerprint(principal);
			const now = Date.now();
			try {
				await ctx.call("users.touch", principal);
			} catch (err) {
				// Without a users service the API still serves webhooks; user routes will answer 503.
				if ((err as Error).name !== "ServiceNotFoundError") throw err;
				return;
			}
			if (this.touchedUsers.size >= TOUCH_CACHE_MAX) this.touchedUsers.clear();
			this.touchedUsers.set(principal.userId, { fingerprint, at: now });
		},
	},

	created(this: UserRecordThis) {
		this.touchedUsers = new Map();
	},
};

export const GatewayUserRecord = schema as Partial<ServiceSchema>;
