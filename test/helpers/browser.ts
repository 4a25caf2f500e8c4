// Debian's Chromium driven by playwright-core (no browser download), one per suite, plus the
// accessibility check (axe-core) and the screenshots the README shows.
import fs from "node:fs";
import path from "node:path";
import { chromium, type Browser, type Page } from "playwright-core";
import AxeBuilder from "@axe-core/playwright";
import { describeWhere } from "./services";

export const CHROMIUM_PATH = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
// Flags that work on a machine without outside network: no background calls home, no sandbox (root).
const CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"];

export const SCREENSHOT_DIR = path.join(__dirname, "..", "..", "docs", "screenshots");
export const VIEWPORTS = {
	desktop: { width: 1280, height: 800 },
	phone: { width: 390, height: 844 },
} as const;

/** `describe` for a browser suite: skipped on a laptop without Chromium, never in CI (describeWhere). */
export function describeBrowserSuite(): jest.Describe {
	return describeWhere({ programs: { [`Chromium at ${CHROMIUM_PATH} (apt-get install -y chromium)`]: fs.existsSync(CHROMIUM_PATH) } });
}

export function launchChromium(): Promise<Browser> {
	return chromium.launch({ executablePath: CHROMIUM_PATH, headless: true, args: CHROMIUM_ARGS });
}

export interface AxeViolationSummary {
	id: string;
	impact: string | null | undefined;
	help: string;
	targets: string[];
}

/** Serious and critical accessibility violations of the page as it is now (WCAG 2.x A and AA rules). */
export async function seriousViolations(page: Page): Promise<AxeViolationSummary[]> {
	const results = await new AxeBuilder({ page }).withTags(["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]).analyze();
	return results.violations
		.filter(violation => violation.impact === "serious" || violation.impact === "critical")
		.map(violation => ({ id: violation.id, impact: violation.impact, help: violation.help, targets: violation.nodes.map(node => String(node.target)) }));
}

/** Writes docs/screenshots/<name>-<desktop|phone>.png, full page, at both widths; restores the viewport. */
export async function screenshotBothWidths(page: Page, name: string): Promise<string[]> {
	fs.mkdirSync(SCREENSHOT_DIR, { recursive: true });
	const original = page.viewportSize();
	const written: string[] = [];
	for (const [label, size] of Object.entries(VIEWPORTS)) {
		await page.setViewportSize(size);
		const file = path.join(SCREENSHOT_DIR, `${name}-${label}.png`);
		await page.screenshot({ path: file, fullPage: true, animations: "disabled", caret: "hide" });
		written.push(file);
	}
	if (original) await page.setViewportSize(original);
	return written;
}
