// Jest runs every suite's in-process stacks from the TypeScript source, and their worker threads
// (the dispatcher's sender threads, SQLite's checkpointer) would each compile their modules through
// tsx: about 0.2 s of CPU per thread, and a run starts about two hundred of them. They load the
// run's transpiled copy instead (service-build.ts), the same code the role processes run.
import { startWorkersFromCopy } from "../../lib/typescript-worker";
import { serviceCopyDir } from "./service-build";

const copy = serviceCopyDir();
if (copy) startWorkersFromCopy(copy);
