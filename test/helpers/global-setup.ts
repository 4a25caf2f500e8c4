// Probes PostgreSQL and NATS once for the whole run and passes the answer to every suite.
import { natsAvailable, postgresAvailable } from "./services";

export default async function globalSetup(): Promise<void> {
	process.env.TEST_POSTGRES = (await postgresAvailable()) ? "yes" : "no";
	process.env.TEST_NATS = (await natsAvailable()) ? "yes" : "no";
}
