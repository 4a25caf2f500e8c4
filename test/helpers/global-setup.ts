// Probes PostgreSQL and NATS once for the whole run and passes the answer to every suite, and
// transpiles the service once for the role processes the suites start (service-build.ts).
import { buildServiceCopy, rememberServiceCopy } from "./service-build";
import { natsAvailable, postgresAvailable } from "./services";

export default async function globalSetup(): Promise<void> {
	process.env.TEST_POSTGRES = (await postgresAvailable()) ? "yes" : "no";
	process.env.TEST_NATS = (await natsAvailable()) ? "yes" : "no";
	rememberServiceCopy(buildServiceCopy());
}
