// The webhooks page: the customer's webhooks with a status switch each, an empty state that
// says what a webhook is, and the create form. After a create the secret is shown once.
import { useEffect, useState } from "preact/hooks";
import { Api, ApiError } from "../api";
import { DisabledNote, Feedback, Link, SecretPanel, Switch } from "../components/common";
import { WebhookForm, type WebhookFormValues } from "../components/WebhookForm";
import type { Webhook, WebhookPage, WebhookTopic, WebhookWithSecret } from "../types";

export function topicName(topics: WebhookTopic[], topic: string): string {
	return topics.find(item => item.topic === topic)?.name ?? topic;
}

export function WebhooksPage(props: { api: Api }) {
	const { api } = props;
	const [webhooks, setWebhooks] = useState<Webhook[] | null>(null);
	const [nextLink, setNextLink] = useState<string | null>(null);
	const [topics, setTopics] = useState<WebhookTopic[]>([]);
	const [error, setError] = useState<ApiError | null>(null);
	const [creating, setCreating] = useState(false);
	const [created, setCreated] = useState<WebhookWithSecret | null>(null);
	const [status, setStatus] = useState("");

	const load = async (more?: string) => {
		try {
			const page = await api.get<WebhookPage>(more ?? "/webhooks?per_page=100");
			setWebhooks(current => (more && current ? [...current, ...page.webhooks] : page.webhooks));
			const next = page.links.find(link => link.rel === "next");
			setNextLink(next ? next.href.replace(/^\/id\/v3/, "") : null);
		} catch (err) {
			if (err instanceof ApiError) setError(err);
		}
	};

	useEffect(() => {
		void load();
		api.get<WebhookTopic[]>("/webhooks/events").then(setTopics, err => err instanceof ApiError && setError(err));
	}, [api]);

	const create = async (values: WebhookFormValues) => {
		const webhook = await api.post<WebhookWithSecret>("/webhooks", values);
		setCreating(false);
		setCreated(webhook);
		setWebhooks(current => [...(current ?? []), stripSecret(webhook)]);
	};

	const toggle = async (webhook: Webhook, active: boolean) => {
		setError(null);
		try {
			const updated = await api.patch<Webhook>(`/webhooks/${webhook.id}`, { active });
			setWebhooks(current => (current ?? []).map(item => (item.id === updated.id ? updated : item)));
			setStatus(`${updated.name} is now ${updated.active ? "enabled: deliveries resume" : "disabled: deliveries are paused"}.`);
		} catch (err) {
			if (err instanceof ApiError) setError(err);
		}
	};

	return (
		<main id="main">
			<div class="page-head">
				<h1>Webhooks</h1>
				{!creating && !created && webhooks && webhooks.length > 0 && (
					<button type="button" class="primary" onClick={() => setCreating(true)}>
						New webhook
					</button>
				)}
			</div>
			<Feedback error={error} status={status} />
			{created && <SecretPanel name={created.name} secret={created.secret} onDone={() => setCreated(null)} />}
			{(creating || (webhooks?.length === 0 && !created)) && topics.length > 0 && (
				<section aria-labelledby="create-heading" class="card">
					{webhooks?.length === 0 && !creating && <EmptyState />}
					<h2 id="create-heading">Create a webhook</h2>
					<WebhookForm
						idPrefix="create"
						topics={topics}
						submitLabel="Create webhook"
						onSubmit={create}
						onCancel={webhooks?.length ? () => setCreating(false) : undefined}
						focusOnOpen={creating}
					/>
				</section>
			)}
			{webhooks === null && !error && <p aria-live="polite">Loading…</p>}
			{webhooks && webhooks.length > 0 && (
				<section aria-labelledby="list-heading">
					<h2 id="list-heading" class="visually-hidden">
						Your webhooks
					</h2>
					<ul class="webhook-list">
						{webhooks.map(webhook => (
							<li key={webhook.id} class="card webhook-item">
								<div class="webhook-main">
									<h3>
										<Link href={`/webhooks/${webhook.id}`}>{webhook.name}</Link>
									</h3>
									<p class="mono break">{webhook.url}</p>
									<p class="events">
										<span class="visually-hidden">Event types: </span>
										{webhook.events.map(topic => (
											<span class="tag" key={topic}>
												{topicName(topics, topic)}
											</span>
										))}
									</p>
								</div>
								<div class="webhook-status">
									<Switch checked={webhook.active} label={`Deliveries to ${webhook.name}`} text={["Enabled", "Disabled"]} onChange={active => toggle(webhook, active)} />
									<DisabledNote webhook={webhook} />
								</div>
							</li>
						))}
					</ul>
					{nextLink && (
						<button type="button" onClick={() => load(nextLink)}>
							Show more webhooks
						</button>
					)}
				</section>
			)}
		</main>
	);
}

function EmptyState() {
	return (
		<div class="empty">
			<h2>No webhooks yet</h2>
			<p>
				A webhook sends an HTTPS request to a URL of yours the moment something happens, for example when a tasking order's status changes, so
				your systems learn of it without asking. Each request is signed with a secret only you and this service know, and failed deliveries are
				retried for six hours.
			</p>
		</div>
	);
}

export function stripSecret(webhook: WebhookWithSecret): Webhook {
	const { secret: _secret, ...rest } = webhook;
	return rest;
}
