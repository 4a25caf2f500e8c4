// The sign-in screen: a token field with the command that mints one (embedded default), or a
// button that goes to the identity provider (OIDC_ISSUER set).
import { useState } from "preact/hooks";
import { looksLikeJwt, userManager } from "../auth";
import type { WebClientConfig } from "../types";

export function SignIn(props: { config: WebClientConfig; notice: string | null; onToken: (token: string) => void }) {
	const auth = props.config.auth;
	const [token, setToken] = useState("");
	const [error, setError] = useState<string | null>(null);
	const [busy, setBusy] = useState(false);

	const submit = (event: Event) => {
		event.preventDefault();
		// Whatever was pasted around the token (npm's "> …" banner without -s, a "Bearer " prefix)
		// is left out, as long as exactly one token is in it.
		const candidates = token.split(/\s+/).filter(looksLikeJwt);
		const value = candidates.length === 1 ? candidates[0] : token.trim();
		if (!looksLikeJwt(value)) {
			setError("This is not a token: paste the whole line the command printed (three parts separated by dots).");
			return;
		}
		props.onToken(value);
	};

	const startOidc = async () => {
		if (auth.mode !== "oidc") return;
		setBusy(true);
		setError(null);
		try {
			await userManager(auth).signinRedirect();
		} catch {
			setBusy(false);
			setError(`The identity provider at ${auth.issuer} could not be reached. Try again in a moment.`);
		}
	};

	return (
		<main id="main" class="signin">
			<h1>Sign in</h1>
			<p>Manage the webhooks and the email notifications of your satellite tasking orders.</p>
			{props.notice && (
				<p class="banner error" role="alert">
					{props.notice}
				</p>
			)}
			{auth.mode === "oidc" ? (
				<>
					<button type="button" class="primary large" onClick={startOidc} disabled={busy}>
						{busy ? "Redirecting…" : "Sign in with your organisation"}
					</button>
					{error && (
						<p class="field-error" role="alert">
							{error}
						</p>
					)}
				</>
			) : (
				<form onSubmit={submit} noValidate>
					<p>This service runs without an identity provider. Mint a token on the machine that runs it, then paste it here:</p>
					<pre class="command">
						<code>{auth.token_command}</code>
					</pre>
					<label for="token">Access token</label>
					<textarea
						id="token"
						name="token"
						rows={4}
						class="mono"
						autoComplete="off"
						spellcheck={false}
						value={token}
						aria-invalid={error ? true : undefined}
						aria-describedby={error ? "token-error" : "token-hint"}
						onInput={event => setToken((event.target as HTMLTextAreaElement).value)}
					/>
					<p class="hint" id="token-hint">
						The token stays in this browser tab only and is forgotten when you close it.
					</p>
					{error && (
						<p class="field-error" id="token-error">
							{error}
						</p>
					)}
					<button type="submit" class="primary">
						Sign in
					</button>
				</form>
			)}
		</main>
	);
}
