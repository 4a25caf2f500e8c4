// ESLint 9 flat config: the recommended JavaScript and typescript-eslint rules for the whole tree.
// Rules that need type information are left out on purpose: they double the lint time on a
// 2-core CI machine, and `npm run typecheck` already runs the compiler.
const js = require("@eslint/js");
const tseslint = require("typescript-eslint");

module.exports = tseslint.config(
	{ ignores: ["node_modules/", "data/", "coverage/", "dist/", "web/dist/", "sdk/dist/", "sdk/.dist-check-*/", ".image-check-*/", ".test-build-*/", ".bench-build-*/", ".ci/.cache/"] },
	js.configs.recommended,
	...tseslint.configs.recommended,
	{
		rules: {
			// Unused arguments named with a leading underscore document a required signature.
			"@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_", caughtErrors: "none" }],
			// app.ts loads services lazily so that e.g. SERVICES=dispatcher skips the gateway's dependencies;
			// lib/tracing.ts loads OpenTelemetry only when an OTLP endpoint is configured; the dispatcher
			// loads the in-process sender (and undici) only when it has no sender threads; only a cluster
			// node loads nats.js and the JetStream intake (moleculer.config.ts, lib/intake-channel.ts,
			// lib/startup-dependencies.ts, lib/connection-urls.ts); the ops server loads the token
			// verifier (and jose) on the first remote caller with a token.
			"@typescript-eslint/no-require-imports": ["error", { allow: ["^\\./services/", "^\\./tracing-sdk$", "^\\.\\./lib/webhook-sender$", "^\\./lib/intake-jetstream$", "^nats$", "^\\./auth$"] }],
		},
	},
	{
		// Tests read parsed JSON response bodies whose shape the assertions themselves check.
		files: ["test/**/*.ts"],
		rules: { "@typescript-eslint/no-explicit-any": "off" },
	},
	{
		// The web application runs in the browser (Preact, ES modules, bundled by Vite).
		files: ["web/**/*.{ts,tsx,mts}"],
		languageOptions: {
			sourceType: "module",
			parserOptions: { ecmaFeatures: { jsx: true } },
			globals: { window: "readonly", document: "readonly", navigator: "readonly", sessionStorage: "readonly", fetch: "readonly", requestAnimationFrame: "readonly" },
		},
	},
	{
		// ES-module scripts run by Node: the test OpenID Provider (which must be ESM) and examples/.
		files: ["**/*.mjs"],
		languageOptions: { sourceType: "module", globals: { process: "readonly", URL: "readonly", console: "readonly", fetch: "readonly", setTimeout: "readonly" } },
	},
	{
		// Plain CommonJS configuration files (this one, jest.config.js).
		files: ["**/*.js"],
		languageOptions: {
			sourceType: "commonjs",
			globals: { require: "readonly", module: "writable", process: "readonly", __dirname: "readonly" },
		},
		rules: { "@typescript-eslint/no-require-imports": "off" },
	},
);
