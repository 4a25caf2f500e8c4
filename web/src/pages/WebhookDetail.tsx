// One webhook: its status switch, test, rotate and delete (both confirmed), the edit form (name,
// events, ordering, rate limit), the 24-hour health chart and the delivery log.
import { useEffect, useState } from "preact/hooks";
import { Api, ApiError } from "../api";
import { ConfirmDialog, DisabledNote, Feedback, formatTime, Link, ProblemBanner, SecretPanel, Switch } from "../components/common";
import { ORDERING_LABELS, rateLimitLabel, WebhookForm, type WebhookFormValues } from "../components/WebhookForm";
import { HealthChart } from "../components/HealthChart";
import { DeliveryLog } from "../components/DeliveryLog";
import { navigate } from "../router";
import { topicName } from "./Webhooks";
import type { Webhook, WebhookStats, WebhookTestOutcome, WebhookTopic, WebhookWithSecret } from "../types";

type Confirming = "rotate" | "delete" | null;

export function WebhookDetailPage(props: { api: Api; id: string }) {
	const { api, id } = props;
	const [webhook, setWebhook] = useState<Webhook | null>(null);
	const [topics, setTopics] = useState<WebhookTopic[]>([]);
	const [stats, setStats] = useState<WebhookStats | null>(null);
	const [error, setError] = useState<ApiError | null>(null);
	const [missing, setMissing] = useState(false);
	const [editing, setEditing] = useState(false);
	const [testing, setTesting] = useState(false);
	const [testResult, setTestResult] = useState<WebhookTestOutcome | null>(null);
	const [confirming, setConfirming] = useState<Confirming>(null);
	const [secret, setSecret] = useState<WebhookWithSecret | null>(null);
	const [status, setStatus] = useState("");
	const [refreshKey, setRefreshKey] = useState(0);

	const fail = (err: unknown) => {
		if (!(err instanceof ApiError)) throw err;
		if (err.status === 404) setMissing(true);
		else setError(err);
	};
	const loadStats = () => api.get<WebhookStats>(`/webhooks/${id}/stats?window=24h`).then(setStats, fail);

	useEffect(() => {
		api.get<Webhook>(`/webhooks/${id}`).then(setWebhook, fail);
		api.get<WebhookTopic[]>("/webhooks/events").then(setTopics, fail);
		void loadStats();
	}, [api, id]);

	if (missing) {
		return (
			<main id="main">
				<h1>Webhook not found</h1>
				<p>It was deleted, or it belongs to another customer.</p>
				<Link href="/webhooks">Back to webhooks</Link>
			</main>
		);
	}
	if (!webhook) {
		return (
			<main id="main">
				<ProblemBanner error={error} />
				<p aria-live="polite">Loading…</p>
			</main>
		);
	}

	const act = async (work: () => Promise<void>) => {
		setError(null);
		try {
			await work();
		} catch (err) {
			fail(err);
		}
	};

	const toggle = (active: boolean) =>
		act(async () => {
			setWebhook(await api.patch<Webhook>(`/webhooks/${id}`, { active }));
			setStatus(active ? "Enabled: deliveries resume." : "Disabled: deliveries are paused until you enable it again.");
			setRefreshKey(key => key + 1);
		});

	const test = () =>
		act(async () => {
			setTesting(true);
			setTestResult(null);
			try {
				setTestResult(await api.post<WebhookTestOutcome>(`/webhooks/${id}/test`));
			} finally {
				setTesting(false);
			}
		});

	const rotate = () =>
		act(async () => {
			setConfirming(null);
			const rotated = await api.post<WebhookWithSecret>(`/webhooks/${id}/rotate`);
			setSecret(rotated);
		});

	const remove = () =>
		act(async () => {
			setConfirming(null);
			await api.delete(`/webhooks/${id}`);
			navigate("/webhooks");
		});

	const save = async (values: WebhookFormValues) => {
		const updated = await api.patch<Webhook>(`/webhooks/${id}`, { name: values.name, events: values.events, ordering: values.ordering, rate_limit: values.rate_limit });
		setWebhook(updated);
		setEditing(false);
		setStatus("Changes saved.");
	};

	return (
		<main id="main">
			<p class="breadcrumb">
				<Link href="/webhooks">Webhooks</Link> <span aria-hidden="true">›</span>
			</p>
			<div class="page-head">
				<h1>{webhook.name}</h1>
				<Switch checked={webhook.active} label={`Deliveries to ${webhook.name}`} text={["Enabled", "Disabled"]} onChange={toggle} />
			</div>
			<p class="mono break">{webhook.url}</p>
			<DisabledNote webhook={webhook} />
			<Feedback error={error} status={status} />
			{secret && <SecretPanel name={secret.name} secret={secret.secret} rotated onDone={() => setSecret(null)} />}

			<div class="toolbar">
				<button type="button" onClick={test} disabled={testing}>
					{testing ? "Sending test event…" : "Send test event"}
				</button>
				<button type="button" onClick={() => setEditing(!editing)} aria-expanded={editing} aria-controls="edit-section">
					Edit webhook
				</button>
				<button type="button" onClick={() => setConfirming("rotate")}>
					Rotate secret
				</button>
				<button type="button" class="danger" onClick={() => setConfirming("delete")}>
					Delete
				</button>
			</div>
			<div aria-live="polite">
				{testResult &&
					(testResult.success ? (
						<p class="banner ok test-result">Test passed: {testResult.detail}.</p>
					) : (
						<p class="banner error test-result">
							Test failed: {testResult.status_code !== null ? <strong>{testResult.status_code}</strong> : null} {testResult.title}. {testResult.detail}
						</p>
					))}
			</div>

			{editing && topics.length > 0 && (
				<section id="edit-section" class="card" aria-labelledby="edit-heading">
					<h2 id="edit-heading">Edit webhook</h2>
					<WebhookForm
						idPrefix="edit"
						editing
						topics={topics}
						initial={{ name: webhook.name, url: webhook.url, events: webhook.events, ordering: webhook.ordering, rate_limit: webhook.rate_limit }}
						submitLabel="Save changes"
						onSubmit={save}
						onCancel={() => setEditing(false)}
						focusOnOpen
					/>
				</section>
			)}

			<section class="card" aria-labelledby="details-heading">
				<h2 id="details-heading">Details</h2>
				<dl class="details">
					<dt>Event types</dt>
					<dd>{webhook.events.map(topic => topicName(topics, topic)).join(", ")}</dd>
					<dt>Created</dt>
					<dd>{formatTime(webhook.created_at)}</dd>
					<dt>Id</dt>
					<dd class="mono break">{webhook.id}</dd>
					<dt>Ordering</dt>
					<dd>{ORDERING_LABELS[webhook.ordering]}</dd>
					<dt>Rate limit</dt>
					<dd>{rateLimitLabel(webhook.rate_limit)}</dd>
				</dl>
			</section>

			<section class="card" aria-labelledby="health-heading">
				<h2 id="health-heading">Health, last 24 hours</h2>
				{stats ? <HealthChart stats={stats} /> : <p>Loading…</p>}
			</section>

			<DeliveryLog
				api={api}
				webhookId={id}
				refreshKey={refreshKey}
				onChange={() => {
					void loadStats();
				}}
			/>

			<ConfirmDialog open={confirming === "rotate"} title="Rotate the signing secret?" confirmLabel="Rotate secret" onConfirm={rotate} onCancel={() => setConfirming(null)}>
				<p>A new secret starts signing deliveries now. The current one keeps signing alongside it for a grace period, so you can update your receiver.</p>
			</ConfirmDialog>
			<ConfirmDialog open={confirming === "delete"} title={`Delete “${webhook.name}”?`} confirmLabel="Delete webhook" danger onConfirm={remove} onCancel={() => setConfirming(null)}>
				<p>Its pending deliveries are cancelled and it cannot be restored.</p>
			</ConfirmDialog>
		</main>
	);
}
