// Schemas shared by several resources: ids, paging.
import { z } from "zod";

export const uuid = z.uuid({ message: "must be a UUID" });

/** Query values arrive as strings; per_page is 1..100, default 25. */
export const PageQuery = z.object({
	per_page: z.coerce
		.number({ message: "must be a whole number from 1 to 100" })
		.int("must be a whole number from 1 to 100")
		.min(1, "must be a whole number from 1 to 100")
		.max(100, "must be a whole number from 1 to 100")
		.default(25),
	token: z.string().max(512, "is not a valid page token").optional(),
});
export type PageQuery = z.infer<typeof PageQuery>;

export const PageContext = z.object({
	per_page: z.number().int(),
	matched: z.number().int(),
	returned: z.number().int(),
});

export const PageLink = z.object({
	rel: z.literal("next"),
	href: z.string(),
	method: z.literal("GET"),
});
