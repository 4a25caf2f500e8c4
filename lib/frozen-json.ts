// Answers that a service keeps and hands out again unchanged (a cached page) are frozen, deeply,
// and serialised once: the gateway's JSON encoding of such an answer is remembered with it. Only
// objects frozen here are remembered, and they cannot change, so the remembered text is always
// JSON.stringify of the object. Across processes an answer arrives as a new object and is
// serialised as usual.
const serialised = new WeakMap<object, string>();

function deepFreeze(value: unknown): void {
	if (typeof value !== "object" || value === null || Object.isFrozen(value)) return;
	for (const key of Object.keys(value)) deepFreeze((value as Record<string, unknown>)[key]);
	Object.freeze(value);
}

/** Freezes `value` and everything it holds, so that it can be handed out many times, and serialises it. */
export function frozenAnswer<T extends object>(value: T): Readonly<T> {
	deepFreeze(value);
	serialised.set(value, JSON.stringify(value));
	return value;
}

/** JSON.stringify, done once for a frozen answer. */
export function jsonOf(value: unknown): string {
	return (typeof value === "object" && value !== null && serialised.get(value)) || JSON.stringify(value);
}
