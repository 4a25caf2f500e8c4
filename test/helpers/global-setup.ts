// Probes PostgreSQL and NATS once for the whole run and passes the answer to every suite,
// compacts the test database's catalogs when earlier runs have bloated them (services.ts),
// transpiles the service once for the role processes the suites start (service-build.ts), and
// notes when the run started, so that `npm run build` runs once per run (compiled-build.ts).
import { rememberRunStart } from "./compiled-build";
import { buildServiceCopy, rememberServiceCopy } from "./service-build";
import { compactTestCatalogs, natsAvailable, postgresAvailable } from "./services";

export default async function globalSetup(): Promise<void> {
	rememberRunStart();
	process.env.TEST_POSTGRES = (await postgresAvailable()) ? "yes" : "no";
	if (process.env.TEST_POSTGRES === "yes") await compactTestCatalogs();
	process.env.TEST_NATS = (await natsAvailable()) ? "yes" : "no";
	rememberServiceCopy(buildServiceCopy());
}
