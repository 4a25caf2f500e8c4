// Builds the web application into web/dist, which the gateway serves (lib/web-app.ts). Asset
// names carry a content hash, so the gateway can cache them for a year.
import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";
import preact from "@preact/preset-vite";

export default defineConfig({
	root: fileURLToPath(new URL(".", import.meta.url)),
	base: "/",
	plugins: [preact()],
	build: {
		outDir: "dist",
		emptyOutDir: true,
		assetsDir: "assets",
		// The strict Content-Security-Policy allows no inline script or style: keep everything in files.
		assetsInlineLimit: 0,
		sourcemap: false,
		target: "es2022",
	},
	server: {
		// `npx vite web` during development: the API comes from `npm start` on :3000.
		proxy: { "/id/v3": "http://localhost:3000", "/config.json": "http://localhost:3000" },
	},
});
