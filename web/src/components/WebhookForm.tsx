// The webhook form: "Webhook Name", "URL" and "Event Types", as the specification names them, and
// the delivery "Ordering" and "Rate limit". Creating asks for all of them; editing changes all but
// the URL (fixed).
import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, unplacedErrors } from "../api";
import { FieldMessages, ProblemBanner } from "./common";
import type { WebhookOrdering, WebhookTopic } from "../types";

export interface WebhookFormValues {
	name: string;
	url: string;
	events: string[];
	ordering: WebhookOrdering;
	/**
	 * Deliveries per second, null for no limit. Text that is not a whole number is sent as typed,
	 * so that the service's own message says what it takes, next to the field.
	 */
	rate_limit: number | string | null;
}

type Field = "name" | "url" | "events" | "ordering" | "rate_limit";

const FIELDS = ["name", "url", "events", "event_types", "ordering", "rate_limit"];

/** The choices in the order shown; the record makes the compiler insist on one label per value. */
export const ORDERING_LABELS: Record<WebhookOrdering, string> = { per_order: "Per order (default)", none: "None" };
const ORDERINGS = Object.keys(ORDERING_LABELS) as WebhookOrdering[];
const ORDERING_DESCRIPTIONS: Record<WebhookOrdering, string> = {
	per_order: "Each order's statuses arrive one at a time, in the order they happened; an order whose delivery keeps failing holds back only itself.",
	none: "Each status is sent as soon as it comes in, whatever happened to the order's earlier ones.",
};

/** The Details' wording of a webhook's rate limit. */
export const rateLimitLabel = (rateLimit: number | null) => (rateLimit === null ? "No limit" : `${rateLimit} per second`);

/** The box's text as the API takes it: empty is no limit, digits a number, anything else as typed. */
function rateLimitOf(text: string): number | string | null {
	const trimmed = text.trim();
	if (trimmed === "") return null;
	return /^\d{1,15}$/.test(trimmed) ? Number(trimmed) : trimmed;
}

/** What to show next to a field: the `errors` entries for its path, or a 409's detail when it names the field. */
function messagesFor(error: ApiError | null, field: Field): string[] {
	if (!error) return [];
	if (error.status === 409) {
		const named = field === "name" ? /name/i.test(error.problem.detail) : field === "url" ? /URL/.test(error.problem.detail) : false;
		return named ? [error.problem.detail] : [];
	}
	return field === "events" ? [...error.forField("events"), ...error.forField("event_types")] : error.forField(field);
}

const MAIN_TOPIC = "tasking:order_status";

export function WebhookForm(props: {
	idPrefix: string;
	topics: WebhookTopic[];
	initial?: WebhookFormValues;
	editing?: boolean;
	submitLabel: string;
	onSubmit: (values: WebhookFormValues) => Promise<void>;
	onCancel?: () => void;
	/** Move focus to Webhook Name when the form appears on request (not on page load). */
	focusOnOpen?: boolean;
}) {
	const nameInput = useRef<HTMLInputElement>(null);
	useEffect(() => {
		if (props.focusOnOpen) nameInput.current?.focus();
	}, []);
	// Most webhooks want the platform's main topic, so a new form starts with it ticked.
	const [values, setValues] = useState<WebhookFormValues>(
		props.initial ?? { name: "", url: "", events: props.topics.map(topic => topic.topic).filter(topic => topic === MAIN_TOPIC), ordering: "per_order", rate_limit: null },
	);
	// What is in the Rate limit box, kept apart from the values so that "" and "0" stay as typed.
	const [rateLimitText, setRateLimitText] = useState(props.initial?.rate_limit == null ? "" : String(props.initial.rate_limit));
	const [error, setError] = useState<ApiError | null>(null);
	const [busy, setBusy] = useState(false);
	const id = (field: string) => `${props.idPrefix}-${field}`;
	const fieldMessages = (field: Field, from: ApiError | null = error) => messagesFor(from, field);
	const firstControl: Record<Field, string> = { name: id("name"), url: id("url"), events: id("events-0"), ordering: id(`ordering-${ORDERINGS[0]}`), rate_limit: id("rate_limit") };
	const submit = async (event: Event) => {
		event.preventDefault();
		setBusy(true);
		setError(null);
		try {
			await props.onSubmit({ ...values, name: values.name.trim(), url: values.url.trim(), rate_limit: rateLimitOf(rateLimitText) });
		} catch (err) {
			if (!(err instanceof ApiError)) throw err;
			setError(err);
			// Move focus to the first field with a problem, so keyboard and screen-reader users land on it.
			const first = (["name", "url", "events", "ordering", "rate_limit"] as const).find(field => fieldMessages(field, err).length > 0);
			requestAnimationFrame(() => document.getElementById(first ? firstControl[first] : `${props.idPrefix}-problem`)?.focus());
		} finally {
			setBusy(false);
		}
	};

	const toggleTopic = (topic: string, on: boolean) =>
		setValues(current => ({ ...current, events: on ? [...current.events.filter(item => item !== topic), topic] : current.events.filter(item => item !== topic) }));

	const invalid = (field: Field) => (fieldMessages(field).length > 0 ? true : undefined);
	const describedBy = (field: Field, hint?: string) => [hint, fieldMessages(field).length ? id(`${field}-error`) : undefined].filter(Boolean).join(" ") || undefined;

	return (
		<form class="webhook-form" onSubmit={submit} noValidate>
			<div id={`${props.idPrefix}-problem`} tabIndex={-1}>
				<ProblemBanner error={error} extra={error ? unplacedErrors(error, FIELDS).map(item => `${item.path}: ${item.message}`) : []} />
			</div>
			<div class="field">
				<label for={id("name")}>Webhook Name</label>
				<input
					ref={nameInput}
					id={id("name")}
					name="name"
					type="text"
					maxLength={100}
					required
					autoComplete="off"
					value={values.name}
					aria-invalid={invalid("name")}
					aria-describedby={describedBy("name")}
					onInput={event => setValues({ ...values, name: (event.target as HTMLInputElement).value })}
				/>
				<FieldMessages id={id("name-error")} messages={fieldMessages("name")} />
			</div>
			{props.editing ? (
				<div class="field">
					<span class="label-like">URL</span>
					<p class="mono break">{values.url}</p>
					<p class="hint">A webhook's URL cannot be changed: create a new webhook for a new URL.</p>
				</div>
			) : (
				<div class="field">
					<label for={id("url")}>URL</label>
					<input
						id={id("url")}
						name="url"
						type="url"
						inputMode="url"
						maxLength={2048}
						required
						autoComplete="off"
						placeholder="https://example.com/webhooks/satellite"
						value={values.url}
						aria-invalid={invalid("url")}
						aria-describedby={describedBy("url", id("url-hint"))}
						onInput={event => setValues({ ...values, url: (event.target as HTMLInputElement).value })}
					/>
					<p class="hint" id={id("url-hint")}>
						An https:// address on the public internet. It cannot be changed later.
					</p>
					<FieldMessages id={id("url-error")} messages={fieldMessages("url")} />
				</div>
			)}
			<fieldset class="field" aria-describedby={fieldMessages("events").length ? id("events-error") : undefined}>
				<legend>Event Types</legend>
				{props.topics.map((topic, index) => (
					<div class="checkbox" key={topic.topic}>
						<input
							type="checkbox"
							id={id(`events-${index}`)}
							name="events"
							value={topic.topic}
							checked={values.events.includes(topic.topic)}
							aria-describedby={id(`events-${index}-description`)}
							onChange={event => toggleTopic(topic.topic, (event.target as HTMLInputElement).checked)}
						/>
						<label for={id(`events-${index}`)}>{topic.name}</label>
						<p class="hint" id={id(`events-${index}-description`)}>
							{topic.description} (<code>{topic.topic}</code>)
						</p>
					</div>
				))}
				<FieldMessages id={id("events-error")} messages={fieldMessages("events")} />
			</fieldset>
			<fieldset class="field" aria-describedby={describedBy("ordering")}>
				<legend>Ordering</legend>
				{ORDERINGS.map(ordering => (
					<div class="checkbox" key={ordering}>
						<input
							type="radio"
							id={id(`ordering-${ordering}`)}
							name={id("ordering")}
							value={ordering}
							checked={values.ordering === ordering}
							aria-describedby={id(`ordering-${ordering}-description`)}
							onChange={() => setValues(current => ({ ...current, ordering }))}
						/>
						<label for={id(`ordering-${ordering}`)}>{ORDERING_LABELS[ordering]}</label>
						<p class="hint" id={id(`ordering-${ordering}-description`)}>
							{ORDERING_DESCRIPTIONS[ordering]}
						</p>
					</div>
				))}
				<FieldMessages id={id("ordering-error")} messages={fieldMessages("ordering")} />
			</fieldset>
			<div class="field">
				<label for={id("rate_limit")}>Rate limit</label>
				<input
					id={id("rate_limit")}
					name="rate_limit"
					type="text"
					inputMode="numeric"
					class="narrow"
					autoComplete="off"
					placeholder="No limit"
					value={rateLimitText}
					aria-invalid={invalid("rate_limit")}
					aria-describedby={describedBy("rate_limit", id("rate_limit-hint"))}
					onInput={event => setRateLimitText((event.target as HTMLInputElement).value)}
				/>
				<p class="hint" id={id("rate_limit-hint")}>
					Optional: at most this many deliveries per second (1 to 10000); empty for no limit. Deliveries over it wait their turn, they never fail.
				</p>
				<FieldMessages id={id("rate_limit-error")} messages={fieldMessages("rate_limit")} />
			</div>
			<div class="actions">
				{props.onCancel && (
					<button type="button" onClick={props.onCancel}>
						Cancel
					</button>
				)}
				<button type="submit" class="primary" disabled={busy}>
					{busy ? "Saving…" : props.submitLabel}
				</button>
			</div>
		</form>
	);
}
