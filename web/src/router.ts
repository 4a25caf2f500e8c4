// A few paths, so a tiny router: location.pathname is the state, links push history entries.
import { useEffect, useState } from "preact/hooks";

/** Goes to a path of the app; `replace` leaves no history entry (e.g. for the OIDC callback URL). */
export function navigate(path: string, options: { replace?: boolean } = {}): void {
	if (options.replace) window.history.replaceState(null, "", path);
	else if (path !== window.location.pathname + window.location.search) window.history.pushState(null, "", path);
	window.dispatchEvent(new PopStateEvent("popstate"));
}

export function usePath(): string {
	const [path, setPath] = useState(window.location.pathname);
	useEffect(() => {
		const update = () => setPath(window.location.pathname);
		window.addEventListener("popstate", update);
		return () => window.removeEventListener("popstate", update);
	}, []);
	return path;
}

/** Plain left clicks stay in the app; modified clicks open a tab as usual. */
export function onLinkClick(event: MouseEvent, path: string): void {
	if (event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
	event.preventDefault();
	navigate(path);
}
