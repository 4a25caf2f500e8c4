// Removes what global-setup.ts made for the run.
import { removeServiceCopy } from "./service-build";

export default function globalTeardown(): void {
	removeServiceCopy();
}
