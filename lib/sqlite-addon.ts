// better-sqlite3 is a native addon built on node::ObjectWrap, whose code is compiled into the addon
// from Node's headers. From Node 24.19 on, those headers register an environment cleanup hook for
// every wrapped object and remove it in the destructor, and the removal aborts the whole process
// when the garbage collector frees a statement outside a JavaScript context ("Assertion failed:
// (env) != nullptr", nodejs/node#65446, still so in 24.21). That strikes at a random moment, so the
// embedded mode checks the addon before opening the database instead. better-sqlite3's published
// binaries for Node 24 predate 24.19; only a build from source against newer headers has the hook.
import fs from "node:fs";
import path from "node:path";

/** The Node function that such an addon calls from its destructors, by its exported name. */
const CLEANUP_HOOK_REMOVAL = "RemoveEnvironmentCleanupHook";

/** Where the installed better-sqlite3 keeps its compiled addon. */
export function installedAddonFile(): string {
	return path.join(path.dirname(require.resolve("better-sqlite3/package.json")), "build", "Release", "better_sqlite3.node");
}

/**
 * Why better-sqlite3 cannot be used on this Node, or undefined when it can. Only Node 24 has the
 * hook without the registry that makes its removal safe (Node 26 has both).
 */
export function sqliteAddonProblem(nodeVersion = process.versions.node, addonFile = installedAddonFile()): string | undefined {
	if (nodeVersion.split(".")[0] !== "24" || !fs.existsSync(addonFile)) return undefined;
	if (!fs.readFileSync(addonFile).includes(CLEANUP_HOOK_REMOVAL)) return undefined;
	return (
		`DATABASE_URL: unset, so SQLite, but ${addonFile} was compiled against the headers of Node 24.19 or later, ` +
		"which abort the process when the garbage collector frees a statement (nodejs/node#65446). " +
		"Install better-sqlite3's published binary (`npm rebuild better-sqlite3` with access to GitHub), " +
		"compile it against Node 24.18.1's headers (docs/cluster.md, \"Compiled for production\"), or set DATABASE_URL"
	);
}
