// The shell: loads /config.json, completes an OIDC redirect when coming back from the provider,
// then shows the sign-in screen or the signed-in pages with their navigation.
import { useEffect, useMemo, useState } from "preact/hooks";
import { Api, ApiError } from "./api";
import { CALLBACK_PATH, completeOidcSignIn, forgetToken, storeToken, storedToken } from "./auth";
import { Link } from "./components/common";
import { navigate, usePath } from "./router";
import { SignIn } from "./pages/SignIn";
import { WebhooksPage } from "./pages/Webhooks";
import { WebhookDetailPage } from "./pages/WebhookDetail";
import { NotificationsPage } from "./pages/Notifications";
import type { WebClientConfig } from "./types";

const TITLES: Record<string, string> = { webhooks: "Webhooks", notifications: "Notification settings" };

export function App() {
	const path = usePath();
	const [config, setConfig] = useState<WebClientConfig | null>(null);
	const [fatal, setFatal] = useState<string | null>(null);
	const [token, setToken] = useState<string | null>(storedToken());
	const [notice, setNotice] = useState<string | null>(null);

	useEffect(() => {
		fetch("/config.json", { headers: { Accept: "application/json" } })
			.then(response => (response.ok ? (response.json() as Promise<WebClientConfig>) : Promise.reject(new Error(String(response.status)))))
			.then(setConfig, () => setFatal("The service could not be reached. Reload the page to try again."));
	}, []);

	// Back from the identity provider: trade the code for the token, then forget the URL's code.
	useEffect(() => {
		if (!config || config.auth.mode !== "oidc" || path !== CALLBACK_PATH) return;
		completeOidcSignIn(config.auth).then(
			accessToken => {
				storeToken(accessToken);
				setToken(accessToken);
				navigate("/webhooks", { replace: true });
			},
			() => {
				setNotice("Signing in did not complete. Please try again.");
				navigate("/", { replace: true });
			},
		);
	}, [config, path]);

	const signOut = (message: string | null) => {
		forgetToken();
		setToken(null);
		setNotice(message);
	};

	const api = useMemo(
		() => (config && token ? new Api(config.api_base, token, (error: ApiError) => signOut(`You were signed out: ${error.problem.detail}. Sign in again.`)) : null),
		[config, token],
	);

	const section = path.split("/")[1] || "webhooks";
	useEffect(() => {
		document.title = `${TITLES[section] ?? "Webhook"} · Satellite webhooks`;
	}, [section]);

	if (fatal) return <p role="alert">{fatal}</p>;
	if (!config) return <p aria-live="polite">Loading…</p>;
	if (path === CALLBACK_PATH && !token) return <p aria-live="polite">Signing in…</p>;

	return (
		<>
			<a class="skip-link" href="#main">
				Skip to content
			</a>
			<header class="site-header">
				<span class="brand">Satellite webhooks</span>
				{api && (
					<nav aria-label="Main">
						<Link href="/webhooks" current={section === "webhooks"}>
							Webhooks
						</Link>
						<Link href="/notifications" current={section === "notifications"}>
							Notifications
						</Link>
						<button type="button" class="link-button" onClick={() => signOut(null)}>
							Sign out
						</button>
					</nav>
				)}
			</header>
			{!api ? (
				<SignIn
					config={config}
					notice={notice}
					onToken={value => {
						storeToken(value);
						setNotice(null);
						setToken(value);
						if (path === "/" || path === CALLBACK_PATH) navigate("/webhooks");
					}}
				/>
			) : (
				<Page api={api} path={path} />
			)}
		</>
	);
}

function Page(props: { api: Api; path: string }) {
	const parts = props.path.split("/").filter(Boolean);
	useEffect(() => {
		if (parts.length === 0) navigate("/webhooks");
	}, [props.path]);
	if (parts[0] === "notifications") return <NotificationsPage api={props.api} />;
	if (parts[0] === "webhooks" && parts[1]) return <WebhookDetailPage key={parts[1]} api={props.api} id={parts[1]} />;
	if (parts.length === 0 || parts[0] === "webhooks") return <WebhooksPage api={props.api} />;
	return (
		<main id="main">
			<h1>Page not found</h1>
			<p>
				<Link href="/webhooks">Go to your webhooks</Link>
			</p>
		</main>
	);
}
