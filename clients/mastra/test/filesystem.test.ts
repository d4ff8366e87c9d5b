// AmlfsFilesystem judged by the real @mastra/core from the npm registry: a
// Workspace over it, each generated file tool called directly (no model),
// Workspace mounts with a LocalSandbox that runs `amlfs mount`, and a
// sandbox command and a tool call seeing each other's writes. The mounts
// are real amlfs mounts of a file store; what they hold is checked after a
// save and a restore on a fresh cache dir.
import assert from "node:assert/strict"
import { execFileSync } from "node:child_process"
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import os from "node:os"
import path from "node:path"
import { fileURLToPath } from "node:url"
import { after, before, describe, test } from "node:test"

import {
  createWorkspaceTools,
  FileExistsError,
  FileNotFoundError,
  IsDirectoryError,
  LocalSandbox,
  NotDirectoryError,
  StaleFileError,
  Workspace,
  WorkspaceReadOnlyError,
  WORKSPACE_TOOLS,
} from "@mastra/core/workspace"

import { AmlfsFilesystem, amlfsOnMount } from "../src/index.js"

const repo = fileURLToPath(new URL("../../../", import.meta.url))
let bin: string
let root: string
let store: string
const unmounts: string[] = []

function amlfs(...args: string[]): string {
  return execFileSync(bin, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] })
}

function mountFresh(id: string, ...extra: string[]): string {
  const mp = path.join(root, `mnt-${id}-${unmounts.length}`)
  amlfs("mount", "--daemon", mp, "--store", `file://${store}`, "--id", id, "--cache-dir", path.join(root, `cache-${unmounts.length}`), ...extra)
  unmounts.push(mp)
  return mp
}

before(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), "amlfs-mastra-"))
  store = path.join(root, "store")
  bin = process.env.AMLFS_BIN ?? path.join(root, "amlfs")
  if (process.env.AMLFS_BIN === undefined) {
    execFileSync("go", ["build", "-o", bin, "./cmd/amlfs"], { cwd: repo, stdio: "inherit" })
  }
})

after(async () => {
  for (const mp of unmounts) {
    try {
      amlfs("unmount", "--no-save", mp)
    } catch {
      // unmounted by the test
    }
  }
  await rm(root, { force: true, recursive: true })
})

// A tool's result is text or an object; either way its words are what an agent reads.
const text = (r: unknown) => (typeof r === "string" ? r : JSON.stringify(r))

describe("AmlfsFilesystem", () => {
  test("each file tool of a Workspace, called directly, and the shell see one tree", async () => {
    const mp = mountFresh("tools")
    const fs = new AmlfsFilesystem({ mountpoint: mp, amlfs: bin })
    const workspace = new Workspace({ filesystem: fs })
    await workspace.init()
    const tools = await createWorkspaceTools(workspace)
    const call = (name: string, input: Record<string, unknown>) => tools[name].execute(input, { workspace })
    const T = WORKSPACE_TOOLS.FILESYSTEM

    await writeFile(path.join(mp, "shell.txt"), "written by the shell\n")
    assert.match(text(await call(T.READ_FILE, { path: "/shell.txt" })), /written by the shell/)

    await call(T.WRITE_FILE, { path: "/src/tool.ts", content: "export const x = 1\n" })
    assert.equal(await readFile(path.join(mp, "src/tool.ts"), "utf8"), "export const x = 1\n")

    await call(T.EDIT_FILE, { path: "/src/tool.ts", old_string: "x = 1", new_string: "x = 2" })
    assert.equal(await readFile(path.join(mp, "src/tool.ts"), "utf8"), "export const x = 2\n")

    assert.match(text(await call(T.LIST_FILES, { path: "/" })), /src/)
    assert.match(text(await call(T.FILE_STAT, { path: "/src/tool.ts" })), /file/)
    await call(T.MKDIR, { path: "/made/by/tool" })
    assert.ok((await import("node:fs")).statSync(path.join(mp, "made/by/tool")).isDirectory())
    assert.match(text(await call(T.GREP, { pattern: "x = 2", path: "/" })), /tool\.ts/)
    await call(T.DELETE, { path: "/shell.txt" })
    await assert.rejects(readFile(path.join(mp, "shell.txt")), { code: "ENOENT" })

    // Saved and restored elsewhere: the tools' writes are the workspace's.
    amlfs("unmount", mp)
    const again = mountFresh("tools")
    assert.equal(await readFile(path.join(again, "src/tool.ts"), "utf8"), "export const x = 2\n")
    await workspace.destroy()
  })

  test("the WorkspaceFilesystem methods keep Mastra's contract", async () => {
    const mp = mountFresh("methods")
    const fs = new AmlfsFilesystem({ mountpoint: mp, amlfs: bin })
    await fs.init()
    const bytes = Buffer.from([0, 1, 2, 255, 254])
    await fs.writeFile("/bin/blob", bytes)
    assert.deepEqual(await fs.readFile("/bin/blob"), bytes)
    await fs.writeFile("/a.txt", "one\n")
    await fs.appendFile("/a.txt", "two\n")
    assert.equal(await fs.readFile("/a.txt", { encoding: "utf8" }), "one\ntwo\n")
    await assert.rejects(fs.writeFile("/a.txt", "x", { overwrite: false }), FileExistsError)
    await assert.rejects(fs.writeFile("/no/such/dir/f", "x", { recursive: false }), /not found|DIRECTORY_NOT_FOUND|ENOENT/i)
    const st = await fs.stat("/a.txt")
    assert.equal(st.type, "file")
    assert.equal(st.size, 8)
    await assert.rejects(fs.writeFile("/a.txt", "late", { expectedMtime: new Date(st.modifiedAt.getTime() - 5000) }), StaleFileError)
    await fs.copyFile("/a.txt", "/b.txt")
    await fs.mkdir("/dir")
    await fs.moveFile("/b.txt", "/dir/c.txt")
    assert.equal(await readFile(path.join(mp, "dir/c.txt"), "utf8"), "one\ntwo\n")
    assert.equal(await fs.exists("/b.txt"), false)
    await assert.rejects(fs.readFile("/missing"), FileNotFoundError)
    await assert.rejects(fs.deleteFile("/dir"), IsDirectoryError)
    await assert.rejects(fs.readdir("/a.txt"), NotDirectoryError)
    await fs.mkdir("/deep/er", { recursive: true })
    await fs.writeFile("/deep/er/x.ts", "x")
    await fs.writeFile("/deep/y.md", "y")
    const all = (await fs.readdir("/deep", { recursive: true })).map(e => e.name).sort()
    assert.deepEqual(all, ["er", "er/x.ts", "y.md"])
    assert.deepEqual((await fs.readdir("/deep", { recursive: true, extension: ".ts" })).map(e => e.name), ["er/x.ts"])
    await fs.copyFile("/deep", "/deep2", { recursive: true })
    assert.equal(await readFile(path.join(mp, "deep2/er/x.ts"), "utf8"), "x")
    await assert.rejects(fs.rmdir("/deep"), /not empty|ENOTEMPTY/i)
    await fs.rmdir("/deep", { recursive: true })
    assert.equal(await fs.exists("/deep"), false)
    const found = await fs.grep({ pattern: "TWO", path: "/", caseSensitive: false, includeHidden: false })
    assert.deepEqual(found.map(f => f.path).sort(), ["a.txt", "dir/c.txt"])
    assert.deepEqual(found[0]!.matches[0], { line: 2, column: 0, text: "two" })
    // Over the tools' 10,000 entries: listed whole, through the mount.
    await mkdir(path.join(mp, "many"))
    for (let i = 0; i < 10050; i++) {
      await writeFile(path.join(mp, "many", `f${i}`), "")
    }
    assert.equal((await fs.readdir("/many")).length, 10050)
    // Over the tools' 10 MiB: read through the mount.
    const big = Buffer.alloc(11 << 20, 7)
    await writeFile(path.join(mp, "big.bin"), big)
    assert.ok(big.equals((await fs.readFile("/big.bin")) as Buffer))
    await fs.deleteFile("/a.txt")
    await fs.deleteFile("/a.txt", { force: true })
    await fs.destroy()
  })

  test("readOnly refuses every write", async () => {
    const mp = mountFresh("ro")
    await writeFile(path.join(mp, "f"), "f")
    const fs = new AmlfsFilesystem({ mountpoint: mp, amlfs: bin, readOnly: true })
    await fs.init()
    assert.equal(await fs.readFile("/f", { encoding: "utf8" }), "f")
    await assert.rejects(fs.writeFile("/g", "g"), WorkspaceReadOnlyError)
    await assert.rejects(fs.deleteFile("/f"), WorkspaceReadOnlyError)
    assert.equal(await readFile(path.join(mp, "f"), "utf8"), "f")
  })

  test("Workspace mounts: a LocalSandbox runs amlfs mount; its commands and the tools see each other's writes", async () => {
    const wd = path.join(root, "sandbox")
    await mkdir(wd)
    const fs = new AmlfsFilesystem({ amlfs: bin, mount: ["--store", `file://${store}`, "--id", "mounted", "--cache-dir", path.join(root, "cache-mounted")] })
    const sandbox = new LocalSandbox({ workingDirectory: wd })
    const workspace = new Workspace({ mounts: { "/workspace": fs }, sandbox, onMount: amlfsOnMount({ amlfs: bin }) })
    await workspace.init()
    const mp = fs.basePath!
    unmounts.push(mp)
    assert.equal(mp, path.join(wd, "workspace"))
    const tools = await createWorkspaceTools(workspace)
    const call = (name: string, input: Record<string, unknown>) => tools[name].execute(input, { workspace })
    const T = WORKSPACE_TOOLS.FILESYSTEM

    const shell = await sandbox.executeCommand!("sh", ["-c", "echo from the sandbox > workspace/cmd.txt"])
    assert.equal(shell.exitCode, 0, shell.stderr)
    assert.match(text(await call(T.READ_FILE, { path: "/workspace/cmd.txt" })), /from the sandbox/)

    await call(T.WRITE_FILE, { path: "/workspace/tool.txt", content: "from a tool\n" })
    const cat = await sandbox.executeCommand!("cat", ["workspace/tool.txt"])
    assert.equal(cat.stdout, "from a tool\n")

    await workspace.destroy()
    amlfs("unmount", mp)
    const again = mountFresh("mounted")
    assert.equal(await readFile(path.join(again, "tool.txt"), "utf8"), "from a tool\n")
    assert.equal(await readFile(path.join(again, "cmd.txt"), "utf8"), "from the sandbox\n")
  })
})
