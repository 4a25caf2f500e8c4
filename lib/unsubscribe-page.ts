// The small HTML pages behind GET/POST /email/unsubscribe. Pure rendering; every value is escaped.
//
// The confirmation page's form has no action attribute, so the browser posts back to the very
// URL it was opened with, token included, and the page works under any base URL or proxy prefix.
import { escapeHtml } from "./email-message";

/** Headers for every page: the token is in the URL, so no caching, no Referer, no framing. */
export const UNSUBSCRIBE_PAGE_HEADERS: Record<string, string> = {
	"Cache-Control": "no-store",
	"Referrer-Policy": "no-referrer",
	"X-Frame-Options": "DENY",
	"X-Content-Type-Options": "nosniff",
	"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
};

function page(title: string, body: string): string {
	return [
		"<!DOCTYPE html>",
		'<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">',
		`<title>${escapeHtml(title)}</title>`,
		"<style>body{font-family:Arial,Helvetica,sans-serif;max-width:36rem;margin:3rem auto;padding:0 1rem;color:#222}button{font-size:1rem;padding:.5rem 1.25rem}</style>",
		"</head><body>",
		`<h1>${escapeHtml(title)}</h1>`,
		body,
		"</body></html>",
		"",
	].join("\n");
}

/** GET: asks for confirmation. Opening the link (or a mail scanner fetching it) changes nothing. */
export function confirmUnsubscribePage(topicName: string): string {
	return page(
		"Unsubscribe",
		[
			`<p>Stop email notifications for <strong>${escapeHtml(topicName)}</strong>?</p>`,
			'<form method="post">',
			'<input type="hidden" name="List-Unsubscribe" value="One-Click">',
			'<button type="submit">Unsubscribe</button>',
			"</form>",
		].join("\n"),
	);
}

export function unsubscribedPage(topicName: string): string {
	return page(
		"You are unsubscribed",
		`<p>You will no longer receive email notifications for <strong>${escapeHtml(topicName)}</strong>. You can turn them back on in your notification settings at any time.</p>`,
	);
}

export function invalidLinkPage(message: string): string {
	return page(
		"This link cannot be used",
		`<p>${escapeHtml(message)}. Nothing was changed. You can still turn email notifications off in your notification settings.</p>`,
	);
}
