// Notifier unsubscribe: the RFC 8058 one-click unsubscribe behind the link in every email. The
// link carries a signed token (lib/unsubscribe-token.ts, keyed from SECRETS_KEY in `created`);
// GET shows a confirmation page and never unsubscribes, because link scanners open links; POST
// (one-click or the page's button) turns the topic's email off through users.setEmailPreference.
import type { Context } from "moleculer";
import { z } from "zod";
import { zodParams } from "../validation";
import { invalidField } from "../../lib/errors";
import type { GatewayMeta } from "../../lib/gateway-meta";
import { TASKING_ORDER_STATUS } from "../../lib/schemas/topics";
import { InvalidUnsubscribeTokenError, MAX_UNSUBSCRIBE_TOKEN_LENGTH, verifyUnsubscribeToken } from "../../lib/unsubscribe-token";
import { confirmUnsubscribePage, invalidLinkPage, unsubscribedPage, UNSUBSCRIBE_PAGE_HEADERS } from "../../lib/unsubscribe-page";
import type { NotifierMixin, NotifierThis } from "./shared";

// Form posts and links carry strings only; other fields a mail provider might add are ignored.
const UnsubscribeToken = z.string({ message: "is required" }).min(1, "is required").max(MAX_UNSUBSCRIBE_TOKEN_LENGTH, "is not a valid unsubscribe token");
const UnsubscribePageParams = z.object({ token: z.string().max(MAX_UNSUBSCRIBE_TOKEN_LENGTH * 2).optional() });
type UnsubscribePageParams = z.infer<typeof UnsubscribePageParams>;
const UnsubscribeParams = z.object({
	token: UnsubscribeToken,
	"List-Unsubscribe": z.literal("One-Click", { message: "must be One-Click (RFC 8058)" }).optional(),
});
type UnsubscribeParams = z.infer<typeof UnsubscribeParams>;

const TOPIC_NAMES: Record<string, string> = { [TASKING_ORDER_STATUS.topic]: TASKING_ORDER_STATUS.name };

export const UnsubscribeMixin: NotifierMixin = {
	actions: {
		/** GET /email/unsubscribe: a confirmation page. Never unsubscribes (link scanners open links). */
		unsubscribePage: {
			params: zodParams(UnsubscribePageParams),
			async handler(this: NotifierThis, ctx: Context<UnsubscribePageParams, GatewayMeta>): Promise<string> {
				ctx.meta.$responseType = "text/html; charset=utf-8";
				ctx.meta.$responseHeaders = { ...UNSUBSCRIBE_PAGE_HEADERS };
				try {
					const claims = await verifyUnsubscribeToken(ctx.params.token ?? "", this.unsubscribeKey);
					return confirmUnsubscribePage(this.topicName(claims.topic));
				} catch (err) {
					if (!(err instanceof InvalidUnsubscribeTokenError)) throw err;
					ctx.meta.$statusCode = 422;
					return invalidLinkPage(err.message);
				}
			},
		},

		/**
		 * POST /email/unsubscribe: RFC 8058 one-click (body `List-Unsubscribe=One-Click`) and the
		 * confirmation page's button. Idempotent. A bad or expired token is a 422 and changes nothing.
		 */
		unsubscribe: {
			params: zodParams(UnsubscribeParams),
			async handler(this: NotifierThis, ctx: Context<UnsubscribeParams, GatewayMeta>): Promise<string> {
				let claims;
				try {
					claims = await verifyUnsubscribeToken(ctx.params.token, this.unsubscribeKey);
				} catch (err) {
					if (err instanceof InvalidUnsubscribeTokenError) throw invalidField("token", err.message);
					throw err;
				}
				await ctx.call("users.setEmailPreference", { userId: claims.userId, topic: claims.topic, email: false });
				this.logger.info(`User ${claims.userId} unsubscribed from ${claims.topic} emails`);
				ctx.meta.$responseType = "text/html; charset=utf-8";
				ctx.meta.$responseHeaders = { ...UNSUBSCRIBE_PAGE_HEADERS };
				return unsubscribedPage(this.topicName(claims.topic));
			},
		},
	},

	methods: {
		/** The topic's name as people read it, on the pages and in the email. */
		topicName(this: NotifierThis, topic: string): string {
			return TOPIC_NAMES[topic] ?? topic;
		},
	},
};
