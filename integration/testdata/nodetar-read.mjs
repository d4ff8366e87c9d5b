// Reads an archive revision as AML does: node-tar 7.5.22 with AML's
// options, list then extract. Prints the entries it listed as JSON.
// usage: node nodetar-read.mjs ARCHIVE DIR
import * as tar from 'tar'
import fs from 'fs'
const [archive, dir] = process.argv.slice(2)
const opts = { strict: true, maxDecompressionRatio: 100 }
const entries = []
await tar.list({ ...opts, file: archive, onReadEntry: e => entries.push({ path: e.path, type: e.type, size: e.size }) })
fs.mkdirSync(dir, { recursive: true })
await tar.extract({ ...opts, file: archive, cwd: dir })
console.log(JSON.stringify(entries))
