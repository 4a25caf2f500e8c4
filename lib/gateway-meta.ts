// The ctx.meta that the gateway (services/api.service.ts) and the actions it calls share: the
// caller it authenticated and the request headers it passes on, and what an action sets for the
// HTTP answer (status, Location, ETag, headers, content type). Here, not in the service's file,
// so that the services' mixins can name it without importing a service.
import type { Principal } from "./auth";

export interface GatewayMeta {
	userId?: string;
	customerId?: string;
	principal?: Principal;
	ifMatch?: string;
	etag?: string;
	$statusCode?: number;
	$location?: string;
	$responseHeaders?: Record<string, string>;
	$responseType?: string;
}

/** The part of the meta that services scoped to the caller's customer read (webhooks, dispatcher). */
export type TenantMeta = Pick<GatewayMeta, "customerId">;
