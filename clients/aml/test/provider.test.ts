// amlfsWorkspace judged by AML's own code: its provider conformance suite,
// and its filesystemWorkspace and s3Workspace loading what amlfs saved and
// the other way round, on a file store and on S3 (versitygw on loopback).
import assert from "node:assert/strict"
import { mkdir, readFile, readdir, writeFile } from "node:fs/promises"
import path from "node:path"
import { after, before, describe, test } from "node:test"

import { WorkspaceConflictError as AmlConflict, workspaceProviderConformance } from "@aml-jsx/sdk"
import { S3Client } from "@aws-sdk/client-s3"

import { filesystemWorkspace } from "./.aml/providers/workspaces/local/src/filesystem-workspace.js"
import { s3Workspace } from "./.aml/providers/workspaces/s3/src/index.js"
import {
  amlfsWorkspace,
  WorkspacePublishConflictError,
  WorkspaceRevisionNotFoundError,
  type AmlfsWorkspaceOptions,
  type WorkspaceAcquireRequest,
  type WorkspaceProvider,
  type WorkspaceSaveRequest,
} from "../src/index.js"
import { amlfsBin, s3Env, startS3, tempDir, type S3Server } from "./harness.js"

// The types: amlfsWorkspace is an AML WorkspaceProvider as AML's SDK declares it.
import type { WorkspaceProvider as AmlWorkspaceProvider } from "@aml-jsx/sdk"
const _typecheck: (p: ReturnType<typeof amlfsWorkspace>) => AmlWorkspaceProvider = p => p
void _typecheck

interface Store {
  readonly name: string
  amlfs(extra?: Partial<AmlfsWorkspaceOptions>): WorkspaceProvider
  aml(format?: "archive" | "folder"): WorkspaceProvider
  /** The workspace's index, as AML's providers write it. */
  index(id: string): Promise<{ current: string; revisions: { id: string; format: string }[] }>
}

let s3: S3Server
const cleanups: (() => Promise<void>)[] = []

before(async () => {
  s3 = await startS3()
  cleanups.push(() => s3.stop())
})

after(async () => {
  for (const c of cleanups.reverse()) {
    await c()
  }
})

async function scratch(): Promise<{ tmp: string; cache: string }> {
  const [dir, done] = await tempDir("amlfs-aml-")
  cleanups.push(done)
  return { tmp: path.join(dir, "tmp"), cache: path.join(dir, "cache") }
}

async function fileStore(): Promise<Store> {
  const { tmp, cache } = await scratch()
  const directory = path.join(path.dirname(tmp), "store")
  return {
    name: "file",
    amlfs: extra => amlfsWorkspace({ directory, amlfs: amlfsBin(), cacheDirectory: cache, temporaryDirectory: tmp, ...extra } as AmlfsWorkspaceOptions),
    aml: format => filesystemWorkspace({ directory, temporaryDirectory: tmp, ...(format === undefined ? {} : { format }) }),
    index: async id => JSON.parse(await readFile(path.join(directory, id, "workspace.json"), "utf8")),
  }
}

let prefixes = 0

async function s3Store(): Promise<Store> {
  const { tmp, cache } = await scratch()
  const prefix = `p${++prefixes}/aml/workspaces`
  const env = s3Env()
  const config = { endpoint: s3.endpoint, forcePathStyle: true, region: "us-east-1", credentials: { accessKeyId: env.AWS_ACCESS_KEY_ID!, secretAccessKey: env.AWS_SECRET_ACCESS_KEY! } }
  const client = new S3Client(config)
  return {
    name: "s3",
    amlfs: extra => amlfsWorkspace({ bucket: s3.bucket, prefix, config, amlfs: amlfsBin(), env, cacheDirectory: cache, temporaryDirectory: tmp, ...extra } as AmlfsWorkspaceOptions),
    aml: format => s3Workspace({ bucket: s3.bucket, prefix, client, temporaryDirectory: tmp, ...(format === undefined ? {} : { format }) }),
    index: async id => {
      const { GetObjectCommand } = await import("@aws-sdk/client-s3")
      const out = await client.send(new GetObjectCommand({ Bucket: s3.bucket, Key: `${prefix}/${id}/workspace.json` }))
      return JSON.parse(await out.Body!.transformToString())
    },
  }
}

function request(id: string, extra: Partial<WorkspaceAcquireRequest> = {}): WorkspaceAcquireRequest {
  return { evaluationId: `test-${id}`, id, signal: new AbortController().signal, ...extra }
}

function saveRequest(extra: Partial<WorkspaceSaveRequest> = {}): WorkspaceSaveRequest {
  return { exclude: [], gitignore: true, outcome: "success", retention: 1, signal: new AbortController().signal, ...extra }
}

/** Every file under dir, by relative path, with its content. */
async function tree(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {}
  for (const e of await readdir(dir, { recursive: true, withFileTypes: true })) {
    if (e.isFile()) {
      const p = path.join(e.parentPath, e.name)
      out[path.relative(dir, p)] = await readFile(p, "utf8")
    }
  }
  return out
}

async function put(dir: string, files: Record<string, string>): Promise<void> {
  for (const [rel, content] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(dir, rel)), { recursive: true })
    await writeFile(path.join(dir, rel), content)
  }
}

const sample = { "README.md": "hello\n", "src/a.ts": "export const a = 1\n", "src/deep/b.txt": "b\n", "build.log": "log\n" }

for (const make of [fileStore, s3Store]) {
  describe(make.name.replace("Store", " store"), () => {
    test("AML's provider conformance suite passes", async () => {
      const store = await make()
      await workspaceProviderConformance(store.amlfs())
    })

    test("a conflict is AML's WorkspaceConflictError, and release frees the lease", async () => {
      const store = await make()
      const provider = store.amlfs()
      const first = await provider.acquire(request("conflict"))
      await assert.rejects(provider.acquire(request("conflict")), error => AmlConflict.is(error, "conflict"))
      await first.release()
      const second = await provider.acquire(request("conflict"))
      await second.release()
    })

    for (const format of ["archive", "folder"] as const) {
      test(`AML loads what amlfs saved, and amlfs loads what AML saved (${format})`, async () => {
        const store = await make()
        const ours = await store.amlfs({ format }).acquire(request(`x-${format}`))
        assert.equal((ours.handle as { kind: string }).kind, "amlfs-workspace")
        await put(ours.directory, sample)
        await ours.save(saveRequest({ exclude: ["*.log"] }))
        await ours.release()

        const theirs = await store.aml(format).acquire(request(`x-${format}`))
        const { ["build.log"]: _, ...saved } = sample
        assert.deepEqual(await tree(theirs.directory), saved)
        await put(theirs.directory, { "src/a.ts": "export const a = 2\n", "new.txt": "from AML\n" })
        await theirs.save(saveRequest())
        await theirs.release()

        const again = await store.amlfs({ format }).acquire(request(`x-${format}`))
        assert.deepEqual(await tree(again.directory), { ...saved, "src/a.ts": "export const a = 2\n", "new.txt": "from AML\n" })
        await again.release()
        const index = await store.index(`x-${format}`)
        assert.equal(index.revisions[0]!.format, format)
      })
    }

    test("load: none, a given revision, a selection, and a missing revision", async () => {
      const store = await make()
      const provider = store.amlfs()
      const a = await provider.acquire(request("load"))
      await put(a.directory, { "one.txt": "1\n", "keep/x.txt": "x\n" })
      await a.save(saveRequest({ retention: 3 }))
      const first = (await store.index("load")).current
      await put(a.directory, { "one.txt": "2\n" })
      await a.save(saveRequest({ retention: 3 }))
      await a.release()

      const empty = await provider.acquire(request("load", { load: false }))
      assert.deepEqual(await tree(empty.directory), {})
      await empty.release()

      const old = await provider.acquire(request("load", { load: { revision: first, exclude: [] } }))
      assert.equal((old.handle as { revisionId?: string }).revisionId, first)
      assert.deepEqual(await tree(old.directory), { "one.txt": "1\n", "keep/x.txt": "x\n" })
      await old.release()

      const some = await provider.acquire(request("load", { load: { revision: "current", include: ["keep/**"], exclude: [] } }))
      assert.deepEqual(await tree(some.directory), { "keep/x.txt": "x\n" })
      // A save of a loaded selection is the save request's own selection.
      await put(some.directory, { "more.txt": "m\n" })
      await some.save(saveRequest({ retention: 3 }))
      await some.release()
      const theirs = await store.aml().acquire(request("load"))
      assert.deepEqual(await tree(theirs.directory), { "keep/x.txt": "x\n", "more.txt": "m\n" })
      await theirs.release()

      await assert.rejects(provider.acquire(request("load", { load: { revision: "no-such-revision", exclude: [] } })), error => {
        assert.ok(error instanceof WorkspaceRevisionNotFoundError, String(error))
        assert.equal(error.message, 'Workspace revision "no-such-revision" does not exist')
        return true
      })
      // The failed acquisition freed the lease.
      const last = await provider.acquire(request("load"))
      await last.release()
    })

    test("save: include, gitignore and retention are the request's", async () => {
      const store = await make()
      const lease = await store.amlfs().acquire(request("sel"))
      await put(lease.directory, { ".gitignore": "*.tmp\n", "a.tmp": "t\n", "src/x.ts": "x\n", "doc/y.md": "y\n" })
      await lease.save(saveRequest({ include: ["src/**", ".gitignore"], retention: 2 }))
      await lease.save(saveRequest({ gitignore: false, retention: 2 }))
      await lease.release()
      const index = await store.index("sel")
      assert.equal(index.revisions.length, 2)
      const theirs = await store.aml().acquire(request("sel", { load: { revision: index.revisions[1]!.id, exclude: [] } }))
      assert.deepEqual(await tree(theirs.directory), { ".gitignore": "*.tmp\n", "src/x.ts": "x\n" })
      await theirs.release()
      const current = await store.aml().acquire(request("sel"))
      assert.deepEqual(Object.keys(await tree(current.directory)).sort(), [".gitignore", "a.tmp", "doc/y.md", "src/x.ts"])
      await current.release()
    })

    test("a stale publication is a WorkspacePublishConflictError; the tree stays", async () => {
      const store = await make()
      const ours = await store.amlfs().acquire(request("stale", { lock: false }))
      await put(ours.directory, { "mine.txt": "mine\n" })
      // Another writer, AML's own provider without a lock, publishes.
      const theirs = await store.aml().acquire(request("stale", { lock: false }))
      await put(theirs.directory, { "theirs.txt": "theirs\n" })
      await theirs.save(saveRequest())
      await theirs.release()
      await assert.rejects(ours.save(saveRequest()), error => error instanceof WorkspacePublishConflictError)
      assert.equal(await readFile(path.join(ours.directory, "mine.txt"), "utf8"), "mine\n")
      await ours.release()
      const current = await store.aml().acquire(request("stale"))
      assert.deepEqual(await tree(current.directory), { "theirs.txt": "theirs\n" })
      await current.release()
    })

    test("a cancelled acquisition leaves no mount and no lease", async () => {
      const store = await make()
      const controller = new AbortController()
      const pending = store.amlfs().acquire(request("cancel", { signal: controller.signal }))
      controller.abort(new Error("cancelled"))
      await assert.rejects(pending, /cancelled/)
      // Cancelled at moments through the mount: whatever it reached is undone.
      for (const ms of [5, 30, 80, 150, 300]) {
        const c = new AbortController()
        const p = store.amlfs().acquire(request("cancel", { signal: c.signal }))
        setTimeout(() => c.abort(new Error("cancelled")), ms)
        try {
          const lease = await p
          await lease.release() // it was ready before the cancellation
        } catch (error) {
          assert.match(String(error), /cancelled/)
        }
      }
      const lease = await store.amlfs().acquire(request("cancel"))
      await lease.release()
      await assert.rejects(store.amlfs().acquire(request("cancel2", { signal: AbortSignal.abort(new Error("early")) })), /early/)
    })
  })
}
