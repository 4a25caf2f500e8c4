// Small building blocks shared by the pages: links, problem banners, field messages, switches,
// confirmation dialogs, the copy-once secret panel.
import type { ComponentChildren } from "preact";
import { useEffect, useId, useRef, useState } from "preact/hooks";
import { onLinkClick } from "../router";
import type { ApiError } from "../api";
import type { Webhook } from "../types";

export function Link(props: { href: string; children: ComponentChildren; class?: string; current?: boolean }) {
	return (
		<a href={props.href} class={props.class} aria-current={props.current ? "page" : undefined} onClick={event => onLinkClick(event, props.href)}>
			{props.children}
		</a>
	);
}

/** A problem's title and detail, announced to screen readers as it appears. */
export function ProblemBanner(props: { error: ApiError | null; extra?: string[]; children?: ComponentChildren }) {
	if (!props.error) return null;
	return (
		<div class="banner error" role="alert">
			<p>
				<strong>{props.error.problem.title}.</strong> {props.error.problem.detail}
			</p>
			{props.extra && props.extra.length > 0 && (
				<ul>
					{props.extra.map(message => (
						<li key={message}>{message}</li>
					))}
				</ul>
			)}
			{props.children}
		</div>
	);
}

/** A page's feedback: the last problem, visible, and a quiet confirmation for screen readers. */
export function Feedback(props: { error: ApiError | null; status: string }) {
	return (
		<>
			<ProblemBanner error={props.error} />
			<p class="visually-hidden" role="status">
				{props.status}
			</p>
		</>
	);
}

export function FieldMessages(props: { id: string; messages: string[] }) {
	if (props.messages.length === 0) return null;
	return (
		<p class="field-error" id={props.id}>
			{props.messages.join("; ")}
		</p>
	);
}

export function Switch(props: { checked: boolean; label: string; onChange: (checked: boolean) => void; disabled?: boolean; describedBy?: string; text?: [on: string, off: string] }) {
	const [on, off] = props.text ?? ["On", "Off"];
	return (
		<button
			type="button"
			role="switch"
			class="switch"
			aria-checked={props.checked}
			aria-label={props.label}
			aria-describedby={props.describedBy}
			disabled={props.disabled}
			onClick={() => props.onChange(!props.checked)}
		>
			<span class="switch-track" aria-hidden="true">
				<span class="switch-thumb" />
			</span>
			<span class="switch-text">{props.checked ? on : off}</span>
		</button>
	);
}

/** A modal confirmation: focus moves into it, Escape cancels, the page behind is inert. */
export function ConfirmDialog(props: { open: boolean; title: string; confirmLabel: string; danger?: boolean; onConfirm: () => void; onCancel: () => void; children: ComponentChildren }) {
	const dialog = useRef<HTMLDialogElement>(null);
	const titleId = useId();
	useEffect(() => {
		const element = dialog.current;
		if (!element) return;
		if (props.open && !element.open) element.showModal();
		if (!props.open && element.open) element.close();
	}, [props.open]);
	return (
		<dialog
			ref={dialog}
			aria-labelledby={titleId}
			onCancel={event => {
				event.preventDefault();
				props.onCancel();
			}}
		>
			<h2 id={titleId}>{props.title}</h2>
			<div>{props.children}</div>
			<div class="actions">
				<button type="button" onClick={props.onCancel} autofocus>
					Cancel
				</button>
				<button type="button" class={props.danger ? "danger" : "primary"} onClick={props.onConfirm}>
					{props.confirmLabel}
				</button>
			</div>
		</dialog>
	);
}

/** The signing secret, shown once after create or rotate, with a copy button. */
export function SecretPanel(props: { name: string; secret: string; rotated?: boolean; onDone: () => void }) {
	const [copied, setCopied] = useState<"no" | "yes" | "failed">("no");
	const heading = useRef<HTMLHeadingElement>(null);
	useEffect(() => heading.current?.focus(), []);
	const copy = async () => {
		try {
			await navigator.clipboard.writeText(props.secret);
			setCopied("yes");
		} catch {
			setCopied("failed");
		}
	};
	return (
		<section class="secret-panel" aria-labelledby="secret-heading">
			<h2 id="secret-heading" tabIndex={-1} ref={heading}>
				{props.rotated ? "New signing secret" : "Signing secret"} for “{props.name}”
			</h2>
			<p class="warning" role="note">
				<strong>Copy this secret now. It cannot be shown again.</strong> You need it to verify the signature of every delivery.
				{props.rotated ? " The previous secret keeps signing alongside it for a grace period (24 hours by default), so update your receiver now." : ""}
			</p>
			<label for="secret-value">Secret</label>
			<div class="secret-row">
				<input id="secret-value" class="mono" readOnly value={props.secret} onFocus={event => (event.target as HTMLInputElement).select()} />
				<button type="button" onClick={copy}>
					Copy secret
				</button>
			</div>
			<p aria-live="polite" class="hint">
				{copied === "yes" ? "Copied to the clipboard." : copied === "failed" ? "Copying is not allowed here: select the secret and copy it by hand." : ""}
			</p>
			<button type="button" class="primary" onClick={props.onDone}>
				I have stored the secret
			</button>
		</section>
	);
}

// Every date in the app is written one way (in the browser's language): "24 Nov 2026, 07:01:12";
// an hour of the last 24 as "24 Nov, 07:00", since they span two days.
export function formatTime(iso: string | null | undefined): string {
	if (!iso) return "—";
	const date = new Date(iso);
	return date.toLocaleString(undefined, { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

export function formatHour(iso: string): string {
	return new Date(iso).toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
}

const DISABLED_BECAUSE: Record<NonNullable<Webhook["disabled_reason"]>, string> = {
	user: "Disabled by a user",
	gone: "Disabled: the endpoint answered 410 Gone",
	failing: "Disabled: every delivery failed for days",
};

/** Why and since when a webhook is disabled; nothing while it is enabled. */
export function DisabledNote(props: { webhook: Webhook }) {
	const { disabled_reason: reason, disabled_at: since } = props.webhook;
	if (props.webhook.active || !reason) return null;
	return (
		<p class="disabled-note">
			{DISABLED_BECAUSE[reason]}
			{since && ` (since ${formatTime(since)})`}. Enable it to resume its paused deliveries.
		</p>
	);
}
