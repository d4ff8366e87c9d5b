/**
 * AmlfsFilesystem is a Mastra workspace filesystem over an amlfs mount: a
 * revision-backed, lazily restored working directory that the sandbox's
 * shell and the agent's file tools see as one tree. File operations go
 * through the running daemon's file tools (its control socket), with paths
 * as the sandbox sees them; what those tools lack (append, copy, move) goes
 * through the mount itself.
 */
import { constants } from "node:fs"
import { appendFile, copyFile, cp, lstat, readdir, rename } from "node:fs/promises"
import path from "node:path"

import { AmlfsError, AmlfsMount, amlfs, type RunOptions } from "@amlfs/client"
import {
  DirectoryNotEmptyError,
  DirectoryNotFoundError,
  FileExistsError,
  FileNotFoundError,
  FilesystemNotReadyError,
  IsDirectoryError,
  MastraFilesystem,
  NotDirectoryError,
  PermissionError,
  StaleFileError,
  UnsupportedGrepPatternError,
  WorkspaceReadOnlyError,
  type CopyOptions,
  type FileContent,
  type FileEntry,
  type FilesystemGrepOptions,
  type FilesystemGrepResult,
  type FilesystemIcon,
  type FilesystemInfo,
  type FilesystemMountConfig,
  type FileStat,
  type ListOptions,
  type MastraFilesystemOptions,
  type OnMountHook,
  type ProviderStatus,
  type ReadOptions,
  type RemoveOptions,
  type WriteOptions,
} from "@mastra/core/workspace"

export { AmlfsError } from "@amlfs/client"

/** What a sandbox needs to mount the workspace itself: `amlfs mount --daemon PATH ...args`. */
export interface AmlfsMountConfig extends FilesystemMountConfig {
  type: "amlfs"
  /** `amlfs mount` arguments after the mountpoint: the store, the id, and any flag. */
  args: string[]
  readOnly?: boolean
}

export interface AmlfsFilesystemOptions extends MastraFilesystemOptions {
  id?: string
  /**
   * Where amlfs serves the workspace on this host. Without it, the
   * filesystem is mounted by the sandbox (Workspace `mounts` with
   * `amlfsOnMount()`), which tells it where.
   */
  mountpoint?: string
  /**
   * `amlfs mount` arguments (`["--store", "s3://bucket/prefix", "--id", "ws"]`):
   * init() mounts the workspace at `mountpoint` unless amlfs serves it
   * already, and destroy() unmounts what init() mounted (saving, as the
   * mount's `--save` policy says). They are also the mount config a sandbox
   * mounts with.
   */
  mount?: string[]
  /** Every write fails; amlfs mounts the workspace read-only (`-o ro`). */
  readOnly?: boolean
  /** The amlfs binary (default: `amlfs` on PATH). */
  amlfs?: string
  /** The amlfs commands' environment (default: this process's). */
  env?: NodeJS.ProcessEnv
  displayName?: string
  description?: string
  icon?: FilesystemIcon
}

interface ToolEntry {
  path: string
  type: "file" | "directory" | "symlink" | "other"
  size: number
  mode: number
  mtime: string
  target?: string
}

/**
 * A Mastra WorkspaceFilesystem over an amlfs mount.
 *
 * Paths are absolute in the filesystem's namespace (`/src/a.ts` is
 * `src/a.ts` under the mount's root).
 */
export class AmlfsFilesystem extends MastraFilesystem {
  readonly id: string
  readonly name = "AmlfsFilesystem"
  readonly provider = "amlfs"
  readonly readOnly?: boolean
  readonly displayName?: string
  readonly description?: string
  readonly icon: FilesystemIcon = "hard-drive"
  status: ProviderStatus = "pending"

  #mountpoint: string | undefined
  readonly #mount: string[] | undefined
  readonly #run: RunOptions
  #client: AmlfsMount | undefined
  #mountedHere = false

  constructor(options: AmlfsFilesystemOptions) {
    super({ name: "AmlfsFilesystem", ...options })
    this.id = options.id ?? `amlfs-${Math.random().toString(36).slice(2, 10)}`
    this.#mountpoint = options.mountpoint === undefined ? undefined : path.resolve(options.mountpoint)
    this.#mount = options.mount === undefined ? undefined : [...options.mount, ...(options.readOnly === true ? ["-o", "ro"] : [])]
    this.#run = { ...(options.amlfs === undefined ? {} : { amlfs: options.amlfs }), ...(options.env === undefined ? {} : { env: options.env }) }
    if (options.readOnly !== undefined) {
      this.readOnly = options.readOnly
    }
    if (options.displayName !== undefined) {
      this.displayName = options.displayName
    }
    if (options.description !== undefined) {
      this.description = options.description
    }
    if (options.icon !== undefined) {
      this.icon = options.icon
    }
  }

  /** Where the workspace is mounted on this host (undefined until a sandbox mounts it). */
  get basePath(): string | undefined {
    return this.#mountpoint
  }

  /** Mounts the workspace (with `mount`, unless amlfs serves it already) and finds its daemon. */
  override async init(): Promise<void> {
    if (this.#mountpoint === undefined) {
      return // a sandbox mounts it (amlfsOnMount)
    }
    try {
      this.#client = await AmlfsMount.connect(this.#mountpoint, this.#run)
      return
    } catch (error) {
      if (this.#mount === undefined) {
        throw error // nothing serves it, and nothing to mount it with
      }
    }
    await amlfs(["mount", "--daemon", this.#mountpoint, ...this.#mount], this.#run)
    this.#mountedHere = true
    this.#client = await AmlfsMount.connect(this.#mountpoint, this.#run)
  }

  /** Unmounts what init() mounted, saving as its `--save` policy says. */
  override async destroy(): Promise<void> {
    if (this.#mountedHere && this.#mountpoint !== undefined) {
      await amlfs(["unmount", this.#mountpoint], this.#run)
      this.#mountedHere = false
    }
    this.#client = undefined
  }

  /**
   * Points the filesystem at a mount a sandbox made (amlfsOnMount does).
   */
  async attach(mountpoint: string): Promise<void> {
    this.#mountpoint = path.resolve(mountpoint)
    this.#client = await AmlfsMount.connect(this.#mountpoint, this.#run)
    this.status = "ready"
  }

  getMountConfig(): AmlfsMountConfig {
    if (this.#mount === undefined) {
      throw new Error("AmlfsFilesystem: no `mount` arguments, so a sandbox cannot mount it")
    }
    return { type: "amlfs", args: [...this.#mount], ...(this.readOnly === undefined ? {} : { readOnly: this.readOnly }) }
  }

  getInfo(): FilesystemInfo<{ mountpoint?: string; socket?: string }> {
    return {
      id: this.id,
      name: this.name,
      provider: this.provider,
      status: this.status,
      ...(this.error === undefined ? {} : { error: this.error }),
      ...(this.readOnly === undefined ? {} : { readOnly: this.readOnly }),
      icon: this.icon,
      metadata: {
        ...(this.#mountpoint === undefined ? {} : { mountpoint: this.#mountpoint }),
        ...(this.#client === undefined ? {} : { socket: this.#client.socket }),
      },
    }
  }

  getInstructions(): string {
    return (
      "An amlfs workspace: a durable, revision-backed working directory. The shell and these file tools see one tree; " +
      "a path starting with / is relative to the workspace root." +
      (this.readOnly === true ? " It is read-only." : "")
    )
  }

  resolveAbsolutePath(p: string): string | undefined {
    return this.#mountpoint === undefined ? undefined : path.join(this.#mountpoint, rel(p))
  }

  async #tools(): Promise<AmlfsMount> {
    await this.ensureReady()
    if (this.#client === undefined) {
      throw new FilesystemNotReadyError(this.id)
    }
    return this.#client
  }

  async #call<T>(name: string, args: Record<string, unknown>, p: string): Promise<T> {
    const client = await this.#tools()
    try {
      return await client.tool<T>(name, args)
    } catch (error) {
      throw mapError(error, p, name)
    }
  }

  #writable(operation: string): void {
    if (this.readOnly === true) {
      throw new WorkspaceReadOnlyError(operation)
    }
  }

  /** The path under the mount on this host, for what the tools lack. */
  async #host(p: string): Promise<string> {
    await this.#tools()
    return path.join(this.#mountpoint!, rel(p))
  }

  async #statOrUndefined(p: string): Promise<ToolEntry | undefined> {
    try {
      return await this.#call<ToolEntry>("file_stat", { path: rel(p) }, p)
    } catch (error) {
      if (error instanceof FileNotFoundError) {
        return undefined
      }
      throw error
    }
  }

  async readFile(p: string, options?: ReadOptions): Promise<string | Buffer> {
    let r: { content: string; encoding: "utf-8" | "base64"; truncated: boolean }
    try {
      r = await this.#call("read_file", { path: rel(p) }, p)
    } catch (error) {
      if (!AmlfsError.is(error, "TOO_LARGE")) {
        throw error
      }
      // Over the tools' 10 MiB: read through the mount.
      const { readFile } = await import("node:fs/promises")
      const data = await readFile(await this.#host(p))
      return options?.encoding === undefined ? data : data.toString(options.encoding)
    }
    const data = r.encoding === "base64" ? Buffer.from(r.content, "base64") : Buffer.from(r.content, "utf8")
    return options?.encoding === undefined ? data : data.toString(options.encoding)
  }

  async writeFile(p: string, content: FileContent, options?: WriteOptions): Promise<void> {
    this.#writable("writeFile")
    if (options?.recursive === false) {
      const parent = await this.#statOrUndefined(path.posix.dirname(abs(p)))
      if (parent === undefined) {
        throw new DirectoryNotFoundError(path.posix.dirname(abs(p)))
      }
      if (parent.type !== "directory") {
        throw new NotDirectoryError(path.posix.dirname(abs(p)))
      }
    }
    if (options?.expectedMtime !== undefined) {
      const cur = await this.#statOrUndefined(p)
      if (cur !== undefined && new Date(cur.mtime).getTime() !== options.expectedMtime.getTime()) {
        throw new StaleFileError(abs(p), options.expectedMtime, new Date(cur.mtime))
      }
    }
    const bytes = typeof content === "string" ? undefined : Buffer.from(content)
    await this.#call(
      "write_file",
      {
        path: rel(p),
        content: bytes === undefined ? content : bytes.toString("base64"),
        ...(bytes === undefined ? {} : { encoding: "base64" }),
        overwrite: options?.overwrite ?? true,
      },
      p
    )
  }

  async appendFile(p: string, content: FileContent): Promise<void> {
    this.#writable("appendFile")
    try {
      await appendFile(await this.#host(p), content)
    } catch (error) {
      throw mapError(error, p, "append")
    }
  }

  async deleteFile(p: string, options?: RemoveOptions): Promise<void> {
    this.#writable("deleteFile")
    const st = await this.#statOrUndefined(p)
    if (st === undefined) {
      if (options?.force === true) {
        return
      }
      throw new FileNotFoundError(abs(p))
    }
    if (st.type === "directory") {
      throw new IsDirectoryError(abs(p))
    }
    await this.#call("delete", { path: rel(p) }, p)
  }

  async copyFile(src: string, dest: string, options?: CopyOptions): Promise<void> {
    this.#writable("copyFile")
    const st = await this.#statOrUndefined(src)
    if (st === undefined) {
      throw new FileNotFoundError(abs(src))
    }
    const [from, to] = [await this.#host(src), await this.#host(dest)]
    try {
      if (st.type === "directory") {
        if (options?.recursive !== true) {
          throw new IsDirectoryError(abs(src))
        }
        await cp(from, to, { recursive: true, force: options?.overwrite !== false, errorOnExist: options?.overwrite === false })
        return
      }
      await copyFile(from, to, options?.overwrite === false ? constants.COPYFILE_EXCL : 0)
    } catch (error) {
      throw mapError(error, dest, "copy")
    }
  }

  async moveFile(src: string, dest: string, options?: CopyOptions): Promise<void> {
    this.#writable("moveFile")
    if ((await this.#statOrUndefined(src)) === undefined) {
      throw new FileNotFoundError(abs(src))
    }
    if (options?.overwrite === false && (await this.#statOrUndefined(dest)) !== undefined) {
      throw new FileExistsError(abs(dest))
    }
    try {
      await rename(await this.#host(src), await this.#host(dest))
    } catch (error) {
      throw mapError(error, dest, "move")
    }
  }

  async mkdir(p: string, options?: { recursive?: boolean }): Promise<void> {
    this.#writable("mkdir")
    const st = await this.#statOrUndefined(p)
    if (st !== undefined) {
      if (st.type !== "directory") {
        throw new FileExistsError(abs(p))
      }
      if (options?.recursive === true) {
        return
      }
      throw new FileExistsError(abs(p))
    }
    if (options?.recursive !== true && (await this.#statOrUndefined(path.posix.dirname(abs(p)))) === undefined) {
      throw new DirectoryNotFoundError(path.posix.dirname(abs(p)))
    }
    await this.#call("mkdir", { path: rel(p) }, p)
  }

  async rmdir(p: string, options?: RemoveOptions): Promise<void> {
    this.#writable("rmdir")
    const st = await this.#statOrUndefined(p)
    if (st === undefined) {
      if (options?.force === true) {
        return
      }
      throw new DirectoryNotFoundError(abs(p))
    }
    if (st.type !== "directory") {
      throw new NotDirectoryError(abs(p))
    }
    await this.#call("delete", { path: rel(p), recursive: options?.recursive === true }, p)
  }

  async readdir(p: string, options?: ListOptions): Promise<FileEntry[]> {
    const depth = options?.recursive === true ? (options.maxDepth ?? 0) : 1
    const st = await this.#statOrUndefined(p)
    if (st === undefined) {
      throw new DirectoryNotFoundError(abs(p))
    }
    if (st.type !== "directory") {
      throw new NotDirectoryError(abs(p))
    }
    let r = await this.#call<{ path: string; entries: ToolEntry[]; truncated: boolean }>("list_files", { path: rel(p), depth }, p)
    if (r.truncated) {
      // Over the tools' 10,000 entries: listed through the mount, whole.
      r = { path: r.path, entries: await listMount(await this.#host(p), r.path, depth), truncated: false }
    }
    const exts = options?.extension === undefined ? undefined : [options.extension].flat()
    const out: FileEntry[] = []
    for (const e of r.entries) {
      const name = path.posix.relative(r.path, e.path)
      const type = e.type === "directory" ? "directory" : "file"
      if (exts !== undefined && (type === "directory" || !exts.some(x => name.endsWith(x.startsWith(".") ? x : `.${x}`)))) {
        continue
      }
      out.push({
        name,
        type,
        ...(type === "file" ? { size: e.size } : {}),
        ...(e.type === "symlink" ? { isSymlink: true, ...(e.target === undefined ? {} : { symlinkTarget: e.target }) } : {}),
      })
    }
    return out
  }

  async exists(p: string): Promise<boolean> {
    return (await this.#statOrUndefined(p)) !== undefined
  }

  async stat(p: string): Promise<FileStat> {
    const st = await this.#statOrUndefined(p)
    if (st === undefined) {
      throw new FileNotFoundError(abs(p))
    }
    let created = new Date(st.mtime)
    try {
      const s = await lstat(await this.#host(p), { bigint: false })
      created = s.birthtime.getTime() > 0 ? s.birthtime : created
    } catch {
      // The tool's answer stands.
    }
    return {
      name: path.posix.basename(abs(p)),
      path: abs(p),
      type: st.type === "directory" ? "directory" : "file",
      size: st.type === "directory" ? 0 : st.size,
      createdAt: created,
      modifiedAt: new Date(st.mtime),
    }
  }

  /**
   * Searches in the daemon, in one call. The pattern runs as RE2: one that
   * only JavaScript's engine runs (lookaround, backreferences) and context
   * lines are left to Mastra's own search (UnsupportedGrepPatternError).
   */
  async grep(options: FilesystemGrepOptions): Promise<FilesystemGrepResult[]> {
    if (/\(\?[=!<]|\\[1-9]|\\k</.test(options.pattern)) {
      throw new UnsupportedGrepPatternError(options.pattern, "lookaround and backreferences are not RE2")
    }
    if ((options.contextLines ?? 0) > 0) {
      throw new UnsupportedGrepPatternError(options.pattern, "context lines")
    }
    const js = new RegExp(options.pattern, options.caseSensitive ? "" : "i")
    const max = Math.min(options.maxTotalMatches ?? 10000, 10000)
    const r = await this.#call<{ matches: { path: string; line: number; text: string }[] }>(
      "grep",
      { pattern: options.caseSensitive ? options.pattern : `(?i)${options.pattern}`, path: rel(options.path), max_results: max },
      options.path
    )
    const root = await this.#call<ToolEntry>("file_stat", { path: rel(options.path) }, options.path)
    const byFile = new Map<string, FilesystemGrepResult>()
    for (const m of r.matches) {
      const p = root.type === "directory" ? path.posix.relative(root.path, m.path) : path.posix.basename(m.path)
      if (!options.includeHidden && p.split("/").some(s => s.startsWith("."))) {
        continue
      }
      let f = byFile.get(p)
      if (f === undefined) {
        f = { path: p, matches: [] }
        byFile.set(p, f)
      }
      if (options.maxCountPerFile !== undefined && f.matches.length >= options.maxCountPerFile) {
        continue
      }
      f.matches.push({ line: m.line, column: Math.max(m.text.search(js), 0), text: m.text })
    }
    return [...byFile.values()]
  }
}

/**
 * Lists dir (on the mount) to depth (0: all) as list_files would, with
 * paths under shown, the path list_files gave dir.
 */
async function listMount(dir: string, shown: string, depth: number): Promise<ToolEntry[]> {
  const out: ToolEntry[] = []
  const walk = async (d: string, rel: string, level: number): Promise<void> => {
    for (const e of await readdir(d, { withFileTypes: true })) {
      const p = path.join(d, e.name)
      const st = await lstat(p)
      const type = e.isDirectory() ? "directory" : e.isFile() ? "file" : e.isSymbolicLink() ? "symlink" : "other"
      out.push({ path: path.posix.join(shown, rel, e.name), type, size: st.size, mode: st.mode & 0o7777, mtime: st.mtime.toISOString() })
      if (type === "directory" && (depth === 0 || level < depth)) {
        await walk(p, path.posix.join(rel, e.name), level + 1)
      }
    }
  }
  await walk(dir, "", 1)
  return out.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0))
}

/** A Mastra path (absolute in the filesystem) as the tools take it: relative to the mount's root. */
function rel(p: string): string {
  const r = path.posix.normalize(`/${p}`).replace(/^\/+/, "")
  return r === "" ? "." : r
}

function abs(p: string): string {
  return path.posix.normalize(`/${p}`)
}

/** amlfs's and node's error codes, and the Mastra filesystem error each is. */
const errorOf: Record<string, new (path: string) => Error> = {
  ENOENT: FileNotFoundError,
  EEXIST: FileExistsError,
  EISDIR: IsDirectoryError,
  ENOTDIR: NotDirectoryError,
  ENOTEMPTY: DirectoryNotEmptyError,
}

const denied = new Set(["EACCES", "EPERM", "EROFS", "PATH_ESCAPES_MOUNT"])

/** An error of amlfs or node as Mastra's, with the original as its cause. */
function mapError(error: unknown, p: string, operation: string): unknown {
  const code = AmlfsError.is(error) ? error.code : (error as { code?: string } | undefined)?.code
  if (code === undefined) {
    return error
  }
  const E = errorOf[code]
  const mapped = E !== undefined ? new E(abs(p)) : denied.has(code) ? new PermissionError(abs(p), operation) : undefined
  if (mapped === undefined) {
    return error
  }
  mapped.cause = error
  return mapped
}

/**
 * A Workspace `onMount` hook: a sandbox mounts an AmlfsFilesystem's
 * workspace by running `amlfs mount --daemon` at the mount path (for
 * LocalSandbox, under its working directory), and the filesystem then
 * serves the same mount. Other filesystems mount as their sandbox does.
 */
export function amlfsOnMount(options: { amlfs?: string } = {}): OnMountHook {
  return async ({ filesystem, mountPath, config, sandbox }) => {
    if (config?.type !== "amlfs" || !(filesystem instanceof AmlfsFilesystem)) {
      return undefined
    }
    const args = (config as AmlfsMountConfig).args
    const base = (sandbox as { workingDirectory?: string }).workingDirectory
    const host = base === undefined ? mountPath : path.join(base, mountPath)
    const exec = sandbox.executeCommand
    if (exec === undefined) {
      return { success: false, error: "the sandbox cannot run commands, so it cannot run amlfs mount" }
    }
    const r = await exec.call(sandbox, options.amlfs ?? "amlfs", ["mount", "--daemon", host, ...args])
    if (r.exitCode !== 0) {
      return { success: false, error: `amlfs mount: ${r.stderr.trim()}` }
    }
    await filesystem.attach(host)
    return { success: true }
  }
}
