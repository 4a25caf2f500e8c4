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
	// A bound for a test that hangs, not a measure: on a busy hour a cluster test that takes 25 s
	// on a quiet one takes twice that, and five suites share the two cores.
	testTimeout: 120_000,
	// Suites run side by side: most of their time is spent waiting (for processes to start, leases
	// to end, a fault to play out), not computing. Five workers on the 2-core CI machine (every
	// suite owns its ports, schema, NATS namespace or server, and data directory). Measured on
	// 2026-12-05 within 15 minutes: four workers took 314 s with the machine 86 % busy, five 270 s
	// (92 %), six 255 s (97 %): a sixth saved little more, and made each test slower on a machine
	// with no core left idle. Earlier, three workers took 440 s and four 382 s.
	maxWorkers: 5,
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
