// The embedded mode's check of better-sqlite3's build (lib/sqlite-addon.ts): an addon compiled
// against Node 24.19+ headers calls RemoveEnvironmentCleanupHook from its destructors and aborts
// the process in garbage collection, so SQLite refuses it on Node 24.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { installedAddonFile, sqliteAddonProblem } from "../lib/sqlite-addon";

const installed = installedAddonFile();

describe("sqliteAddonProblem", () => {
	let dir: string;
	let hooked: string;

	beforeAll(() => {
		dir = fs.mkdtempSync(path.join(os.tmpdir(), "sqlite-addon-"));
		// The installed addon's bytes plus the import a 24.19+ build carries in its symbol table.
		hooked = path.join(dir, "better_sqlite3.node");
		fs.writeFileSync(hooked, Buffer.concat([fs.readFileSync(installed), Buffer.from("\0_ZN4node28RemoveEnvironmentCleanupHookEPN2v87IsolateEPFvPvES3_\0")]));
	});

	afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

	it("accepts this checkout's own build, on this Node and on Node 24", () => {
		expect(sqliteAddonProblem()).toBeUndefined();
		expect(sqliteAddonProblem("24.21.0", installed)).toBeUndefined();
	});

	it("refuses, on Node 24, a build that removes cleanup hooks, naming DATABASE_URL, the file and the way out", () => {
		const problem = sqliteAddonProblem("24.21.0", hooked);
		expect(problem).toMatch(/^DATABASE_URL: unset, so SQLite, but /);
		expect(problem).toContain(hooked);
		expect(problem).toContain("nodejs/node#65446");
		expect(problem).toContain("npm rebuild better-sqlite3");
	});

	it("leaves that build alone on Node 20 and 26, and a missing file to better-sqlite3's own error", () => {
		expect(sqliteAddonProblem("20.20.2", hooked)).toBeUndefined();
		expect(sqliteAddonProblem("26.4.0", hooked)).toBeUndefined();
		expect(sqliteAddonProblem("24.21.0", path.join(dir, "absent.node"))).toBeUndefined();
	});
});
