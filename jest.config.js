/** @type {import('jest').Config} */
module.exports = {
	testEnvironment: "node",
	roots: ["<rootDir>/test"],
	testMatch: ["**/*.test.ts"],
	transform: {
		// Type checking is `npm run typecheck`'s job; transpile-only keeps the suite fast.
		"^.+\\.ts$": ["ts-jest", { diagnostics: false }],
	},
	testTimeout: 60_000,
	globalSetup: "<rootDir>/test/helpers/global-setup.ts",
	verbose: false,
};
