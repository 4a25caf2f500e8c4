// Where this code runs from: its TypeScript source (tsx, ts-jest) or compiled into dist/ by
// `npm run build` (tsconfig.build.json), which production runs. Files that are not compiled
// (web/dist) are found from the repository root either way.
import path from "node:path";

/** True under `node dist/server.js`: modules are the compiler's .js output. */
export const RUNNING_COMPILED = path.extname(__filename) === ".js";

/** The repository root: dist/ sits one level below it, as lib/ does. */
export const PROJECT_ROOT = path.resolve(__dirname, "..", ...(RUNNING_COMPILED ? [".."] : []));

/**
 * The .js twin of `file`, a .ts file of the repository, in `copyRoot`: a copy transpiled in the
 * repository's own layout (the test suite's and the benchmark's, bench/lib/transpiled-copy.ts).
 */
export function transpiledTwin(copyRoot: string, file: string): string {
	return path.join(copyRoot, path.relative(PROJECT_ROOT, file)).replace(/\.ts$/, ".js");
}
