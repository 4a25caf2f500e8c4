// Builds the web application (web/ → web/dist) with Vite. Run by `npm install` (the `prepare`
// script) so that the README's `npm install && npm start` serves the app with no extra step.
// A production install (`npm ci --omit=dev`, as in the Docker image) has no Vite: it skips,
// because the image copies web/dist from its build stage.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

const root = path.join(__dirname, "..");
let viteBin: string;
try {
	viteBin = path.join(path.dirname(require.resolve("vite/package.json", { paths: [root] })), "bin", "vite.js");
} catch {
	const built = fs.existsSync(path.join(root, "web", "dist", "index.html"));
	console.warn(`build-web: Vite is not installed (a production install); ${built ? "keeping the web/dist already built" : "the web application is not built"}.`);
	process.exit(0);
}
const result = spawnSync(process.execPath, [viteBin, "build", "--config", path.join(root, "web", "vite.config.mts"), "--logLevel", "warn"], {
	cwd: root,
	stdio: "inherit",
});
process.exit(result.status ?? 1);
