// Pure helpers for email notification preferences: checking a PUT /user/settings body against
// the topic catalogue, merging it into the stored state, and shaping the GET /user/details list.
// A user's state is the set of topics they turned email on for: absence means off, the default.
import { z } from "zod";
import type { CatalogueTopic } from "./schemas/topics";
import { NotificationsUpdate, type CategorySettings, type SettingUpdate } from "./schemas/users";
import { UnprocessableError, type FieldProblem } from "./errors";
import { issuesToProblems } from "./zod-problems";

/** Topics a user may turn email on for, in catalogue order. */
export function emailCapableTopics(catalogue: readonly CatalogueTopic[]): CatalogueTopic[] {
	return catalogue.filter(entry => entry.email);
}

/** The GET /user/details list: every email-capable topic, grouped by category, with its state. */
export function groupByCategory(emailTopics: readonly CatalogueTopic[], enabledTopics: ReadonlySet<string>): CategorySettings[] {
	const groups = new Map<string, CategorySettings>();
	for (const entry of emailTopics) {
		let group = groups.get(entry.category);
		if (!group) {
			group = { category: entry.category, settings: [] };
			groups.set(entry.category, group);
		}
		group.settings.push({ topic: entry.topic, name: entry.name, description: entry.description, email: enabledTopics.has(entry.topic) });
	}
	return [...groups.values()];
}

const UpdateBody = z.object({ notifications: NotificationsUpdate });

function isRecord(value: unknown): value is Record<string, unknown> {
	return typeof value === "object" && value !== null && !Array.isArray(value);
}

function listOf(names: Iterable<string>): string {
	const all = [...names];
	return all.length ? all.join(", ") : "none";
}

/**
 * Walks whatever was sent (even where its shape is wrong) and reports every category or topic
 * the catalogue does not allow, so that one answer lists all problems.
 */
function catalogueProblems(notifications: unknown, emailTopics: readonly CatalogueTopic[]): FieldProblem[] {
	if (!Array.isArray(notifications)) return [];
	const byTopic = new Map(emailTopics.map(entry => [entry.topic, entry]));
	const categories = new Set(emailTopics.map(entry => entry.category));
	const seenTopics = new Set<string>();
	const problems: FieldProblem[] = [];

	notifications.forEach((entry, i) => {
		if (!isRecord(entry)) return;
		const category = typeof entry.category === "string" ? entry.category : undefined;
		const categoryKnown = category !== undefined && categories.has(category);
		if (category !== undefined && !categoryKnown) {
			problems.push({ path: `notifications[${i}].category`, message: `Unknown category "${category}"; known: ${listOf(categories)}` });
		}
		if (!Array.isArray(entry.settings)) return;
		entry.settings.forEach((setting, j) => {
			if (!isRecord(setting) || typeof setting.topic !== "string") return;
			const path = `notifications[${i}].settings[${j}].topic`;
			const topic = setting.topic;
			const known = byTopic.get(topic);
			if (!known) {
				problems.push({ path, message: `Unknown topic "${topic}" (or it has no email notifications); known: ${listOf(byTopic.keys())}` });
			} else if (categoryKnown && known.category !== category) {
				problems.push({ path, message: `Topic "${topic}" belongs to category "${known.category}", not "${category}"` });
			} else if (seenTopics.has(topic)) {
				problems.push({ path, message: `Topic "${topic}" is listed more than once` });
			}
			seenTopics.add(topic);
		});
	});
	return problems;
}

/**
 * Checks a PUT /user/settings `notifications` value against the email-capable topics and returns
 * the requested `{topic, email}` changes. Throws one UnprocessableError naming every problem.
 */
export function parseSettingsUpdate(notifications: unknown, emailTopics: readonly CatalogueTopic[]): SettingUpdate[] {
	const shape = UpdateBody.safeParse({ notifications });
	const problems = [...(shape.success ? [] : issuesToProblems(shape.error)), ...catalogueProblems(notifications, emailTopics)];
	// In the order of the body, so that notifications[2] comes before notifications[10].
	problems.sort((a, b) => a.path.localeCompare(b.path, "en", { numeric: true }));
	if (problems.length > 0 || !shape.success) {
		throw new UnprocessableError("The notification settings failed validation", problems);
	}
	return (shape.data.notifications ?? []).flatMap(entry => entry.settings);
}

/**
 * Merges requested changes into the set of enabled topics. `changed` holds only the settings
 * that differ from the stored state, so a repeated PUT writes nothing.
 */
export function mergeNotificationSettings(
	enabledTopics: ReadonlySet<string>,
	requested: readonly SettingUpdate[],
): { enabled: Set<string>; changed: SettingUpdate[] } {
	const enabled = new Set(enabledTopics);
	const changed: SettingUpdate[] = [];
	for (const { topic, email } of requested) {
		if (enabled.has(topic) === email) continue;
		if (email) enabled.add(topic);
		else enabled.delete(topic);
		changed.push({ topic, email });
	}
	return { enabled, changed };
}
