// Notification settings: one switch per topic that can send email, read from /user/details and
// saved with /user/settings under If-Match, so a change made elsewhere (another tab, an
// unsubscribe link) is never overwritten silently.
import { useEffect, useState } from "preact/hooks";
import { Api, ApiError } from "../api";
import { Feedback, Switch } from "../components/common";
import type { UserDetails } from "../types";

export function NotificationsPage(props: { api: Api }) {
	const { api } = props;
	const [details, setDetails] = useState<UserDetails | null>(null);
	const [etag, setEtag] = useState<string | null>(null);
	const [error, setError] = useState<ApiError | null>(null);
	const [conflict, setConflict] = useState(false);
	const [saving, setSaving] = useState<string | null>(null);
	const [status, setStatus] = useState("");

	const load = async () => {
		try {
			const response = await api.send<UserDetails>("GET", "/user/details");
			setDetails(response.body);
			setEtag(response.headers.get("ETag"));
		} catch (err) {
			if (err instanceof ApiError) setError(err);
		}
	};
	useEffect(() => void load(), [api]);

	const change = async (category: string, topic: string, name: string, email: boolean) => {
		setSaving(topic);
		setError(null);
		setConflict(false);
		try {
			const response = await api.send<UserDetails>("PUT", "/user/settings", {
				body: { notifications: [{ category, settings: [{ topic, email }] }] },
				headers: etag ? { "If-Match": etag } : {},
			});
			setDetails(response.body);
			setEtag(response.headers.get("ETag"));
			setStatus(`Email for ${name} is now ${email ? "on" : "off"}.`);
		} catch (err) {
			if (!(err instanceof ApiError)) throw err;
			if (err.status === 412) {
				setConflict(true);
				await load();
			} else setError(err);
		} finally {
			setSaving(null);
		}
	};

	const topics = details?.user_metadata.notifications.flatMap(category => category.settings.map(setting => ({ ...setting, category: category.category }))) ?? [];

	return (
		<main id="main">
			<h1>Notification settings</h1>
			<p>Choose which events also reach you by email{details?.email ? ` at ${details.email}` : ""}. Email is off until you turn it on.</p>
			{details && !details.email && <p class="banner warn">Your account has no email address, so no email can be sent until your sign-in provides one.</p>}
			{conflict && (
				<div class="banner error" role="alert">
					<p>
						<strong>Not saved: these settings changed somewhere else</strong> (in another tab or window, or through the unsubscribe link of an email)
						after this page loaded them. To avoid overwriting that change, nothing was saved. The switches below now show the current settings; make
						your change again if you still want it.
					</p>
				</div>
			)}
			<Feedback error={error} status={status} />
			{!details && !error && <p aria-live="polite">Loading…</p>}
			{details && (
				<section class="card" aria-labelledby="email-heading">
					<h2 id="email-heading">Email</h2>
					{topics.length === 0 && <p>No event can send email yet.</p>}
					<ul class="settings">
						{topics.map(topic => (
							<li key={topic.topic} class="setting">
								<div>
									<p class="setting-name" id={`topic-${topic.topic.replace(/\W/g, "-")}`}>
										{topic.name}
									</p>
									<p class="hint" id={`topic-${topic.topic.replace(/\W/g, "-")}-description`}>
										{topic.description}
									</p>
								</div>
								<Switch
									checked={topic.email}
									label={`Email for ${topic.name}`}
									describedBy={`topic-${topic.topic.replace(/\W/g, "-")}-description`}
									disabled={saving === topic.topic}
									onChange={email => change(topic.category, topic.topic, topic.name, email)}
								/>
							</li>
						))}
					</ul>
				</section>
			)}
		</main>
	);
}
