// Acquire and one-file-change save of a 10k-file workspace: amlfsWorkspace
// beside AML's own filesystemWorkspace (file store) and s3Workspace (S3:
// versitygw on loopback), the same revision in the same store, targets
// rotated each round; run by bench/aml.sh, which reports the ratios.
// amlfs's acquisitions are timed twice: on the cache directory its last
// release used (where a tree that is the revision is kept: an agent's
// steps on one host), and on a cache directory of its own (a host's first).
import { randomBytes } from "node:crypto"
import { mkdir, writeFile } from "node:fs/promises"
import path from "node:path"

import { S3Client } from "@aws-sdk/client-s3"

import { filesystemWorkspace } from "../test/.aml/providers/workspaces/local/src/filesystem-workspace.js"
import { s3Workspace } from "../test/.aml/providers/workspaces/s3/src/index.js"
import { amlfsWorkspace, type WorkspaceProvider } from "../src/index.js"
import { amlfsBin, s3Env, startS3, tempDir } from "../test/harness.js"

const files = Number(process.env.FILES ?? 10000)
const rounds = Number(process.env.ROUNDS ?? 3)
const size = 4096

const req = (id: string) => ({ evaluationId: "bench", id, signal: new AbortController().signal })
const save = { exclude: [], gitignore: true, outcome: "success" as const, retention: 1, signal: new AbortController().signal }

// Text that compresses about as source does not: AML's archive reader
// refuses an archive that inflates more than 100 times, as one of 10,000
// copies of the same 4 KiB does.
async function seed(dir: string): Promise<void> {
  for (let d = 0; d < files / 100; d++) {
    await mkdir(path.join(dir, `d${d}`), { recursive: true })
    for (let f = 0; f < 100; f++) {
      await writeFile(path.join(dir, `d${d}`, `f${f}`), randomBytes((size / 4) * 3).toString("base64"))
    }
  }
}

interface Times {
  acquire: number[]
  save: number[]
  // amlfs only: an acquisition on a cache directory of its own, with no
  // tree kept from an earlier release (a host's first).
  cold?: number[]
}

async function time<T>(fn: () => Promise<T>): Promise<[number, T]> {
  const t = performance.now()
  const v = await fn()
  return [(performance.now() - t) / 1000, v]
}

async function measure(name: string, providers: Record<string, WorkspaceProvider>, cold: Record<string, (cache: string) => WorkspaceProvider> = {}): Promise<Record<string, Times>> {
  // Each provider's own workspace, the same files, saved by that
  // provider: each round is then its steady state (its own revision, in
  // its own format, with an amlfs index or not).
  const names = Object.keys(providers)
  for (const n of names) {
    const lease = await providers[n]!.acquire(req(n))
    await seed(lease.directory)
    await lease.save(save)
    await lease.release()
  }
  const out: Record<string, Times> = {}
  for (let r = 0; r < rounds; r++) {
    for (let i = 0; i < names.length; i++) {
      const n = names[(i + r) % names.length]!
      const [acq, l] = await time(() => providers[n]!.acquire(req(n)))
      // One file changed, as an agent's step does.
      await writeFile(path.join(l.directory, "d0", "f0"), `round ${r} ${n}\n`)
      const [sv] = await time(() => l.save(save))
      await l.release()
      out[n] ??= { acquire: [], save: [] }
      out[n].acquire.push(acq)
      out[n].save.push(sv)
      if (cold[n]) {
        const [c, cl] = await time(() => cold[n]!(path.join(dir, `cold-${name}-${n}-${r}`)).acquire(req(n)))
        await cl.release()
        ;(out[n].cold ??= []).push(c)
      }
    }
  }
  console.log(JSON.stringify({ store: name, files, rounds, times: out }))
  return out
}

const [dir, done] = await tempDir("amlfs-aml-bench-")
const s3 = await startS3()
try {
  const tmp = path.join(dir, "tmp")
  await mkdir(tmp) // AML's providers make their directories in it
  const store = path.join(dir, "store")
  await measure(
    "file",
    {
      filesystemWorkspace: filesystemWorkspace({ directory: store, temporaryDirectory: tmp }),
      amlfsWorkspace: amlfsWorkspace({ directory: store, amlfs: amlfsBin(), cacheDirectory: path.join(dir, "cache"), temporaryDirectory: tmp }),
      "amlfsWorkspace (fuse)": amlfsWorkspace({ directory: store, serve: "fuse", amlfs: amlfsBin(), cacheDirectory: path.join(dir, "cache-fuse"), temporaryDirectory: tmp }),
    },
    {
      amlfsWorkspace: (cacheDirectory) => amlfsWorkspace({ directory: store, amlfs: amlfsBin(), cacheDirectory, temporaryDirectory: tmp }),
      "amlfsWorkspace (fuse)": (cacheDirectory) => amlfsWorkspace({ directory: store, serve: "fuse", amlfs: amlfsBin(), cacheDirectory, temporaryDirectory: tmp }),
    }
  )
  const env = s3Env()
  const config = { endpoint: s3.endpoint, forcePathStyle: true, region: "us-east-1", credentials: { accessKeyId: env.AWS_ACCESS_KEY_ID!, secretAccessKey: env.AWS_SECRET_ACCESS_KEY! } }
  await measure(
    "s3",
    {
      s3Workspace: s3Workspace({ bucket: s3.bucket, client: new S3Client(config), temporaryDirectory: tmp }),
      amlfsWorkspace: amlfsWorkspace({ bucket: s3.bucket, config, env, amlfs: amlfsBin(), cacheDirectory: path.join(dir, "cache-s3"), temporaryDirectory: tmp }),
      "amlfsWorkspace (fuse)": amlfsWorkspace({ bucket: s3.bucket, config, env, serve: "fuse", amlfs: amlfsBin(), cacheDirectory: path.join(dir, "cache-s3-fuse"), temporaryDirectory: tmp }),
    },
    {
      amlfsWorkspace: (cacheDirectory) => amlfsWorkspace({ bucket: s3.bucket, config, env, amlfs: amlfsBin(), cacheDirectory, temporaryDirectory: tmp }),
      "amlfsWorkspace (fuse)": (cacheDirectory) => amlfsWorkspace({ bucket: s3.bucket, config, env, serve: "fuse", amlfs: amlfsBin(), cacheDirectory, temporaryDirectory: tmp }),
    }
  )
} finally {
  await s3.stop()
  await done()
}
