// Copies AML's source, vendored unchanged in third_party/aml, beside the
// tests: its imports of tar, globby, proper-lockfile and the AWS SDK then
// resolve to this package's node_modules.
import { cp, rm } from "node:fs/promises"

const from = new URL("../../../third_party/aml/", import.meta.url)
const to = new URL("./.aml/", import.meta.url)
await rm(to, { force: true, recursive: true })
await cp(from, to, { recursive: true })
