/** @type {import('jest').Config} */
module.exports = {
	testEnvironment: "node",
	roots: ["<rootDir>/test"],
	// dist/ (npm run build) holds a copy of package.json: not a second package to map.
	modulePathIgnorePatterns: ["<rootDir>/dist/"],
	testMatch: ["**/*.test.ts"],
	transform: {
		// Type checking is `npm run typecheck`'s job; transpile-only keeps the suite fast.
		"^.+\\.ts$": ["ts-jest", { diagnostics: false }],
	},
	// The SDK from its source, as tsconfig.json's paths map it (its package's main is the built dist/).
	moduleNameMapper: { "^@satellite-webhooks/sdk$": "<rootDir>/sdk/src/index.ts" },
	testTimeout: 60_000,
	// Suites run side by side: most of their time is spent waiting (for processes to start, leases
	// to end, a fault to play out), not computing. Four workers on the 2-core CI machine (every
	// suite owns its ports, schema, NATS namespace or server, and data directory): with three, the
	// machine was busy 1.4 cores on average and the suite took 440 s; with four each suite ran
	// about a sixth slower, and the whole took 382 s.
	maxWorkers: 4,
	testSequencer: "<rootDir>/test/helpers/longest-first-sequencer.js",
	globalSetup: "<rootDir>/test/helpers/global-setup.ts",
	globalTeardown: "<rootDir>/test/helpers/global-teardown.ts",
	setupFilesAfterEnv: ["<rootDir>/test/helpers/threads-from-copy.ts"],
	// A suite whose setup fails may never reach its afterAll, leaving a pool or child process
	// open; exit anyway so that a failing run fails at once instead of hanging CI. Passing runs
	// close everything they open (checked with --detectOpenHandles).
	forceExit: true,
	verbose: false,
};
