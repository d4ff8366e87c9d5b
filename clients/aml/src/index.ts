/**
 * amlfsWorkspace is an AML workspace provider whose materialization is an
 * amlfs mount: acquire mounts the workspace's revision at a fresh directory
 * and returns once the mount is ready (a lazy restore fetches files on first
 * use), save is an amlfs commit, and release unmounts without saving. The
 * store is the one AML's own filesystemWorkspace and s3Workspace read and
 * write, in the same format, so a workspace moves freely between them.
 */
import { mkdir, mkdtemp, rm } from "node:fs/promises"
import os from "node:os"
import path from "node:path"

import { AmlfsError, AmlfsMount, amlfs, cliError, run, type MountStatus, type RunOptions } from "@amlfs/client"

export { AmlfsError } from "@amlfs/client"

// AML's provider contract (sdk/src/components/workspace/workspace-provider.ts),
// restated: AML's SDK is not on the npm registry, and the contract is
// structural.

export type WorkspacePersistenceFormat = "archive" | "folder"

export interface WorkspaceLoadRequest {
  readonly exclude: readonly string[]
  readonly include?: readonly string[]
  readonly revision: "current" | string
}

export interface WorkspaceAcquireRequest {
  readonly evaluationId: string
  readonly id: string
  readonly load?: false | WorkspaceLoadRequest
  readonly lock?: boolean
  readonly save?: boolean
  readonly signal: AbortSignal
}

export interface WorkspaceSaveRequest {
  readonly exclude: readonly string[]
  readonly gitignore: boolean
  readonly include?: readonly string[]
  readonly outcome: "failure" | "success"
  readonly retention: number
  readonly signal: AbortSignal
}

export interface WorkspaceLease<Handle = unknown> {
  readonly directory: string
  readonly handle: Handle
  readonly id: string
  release(): Promise<void>
  save(request?: WorkspaceSaveRequest): Promise<void>
}

export interface WorkspaceProvider<Handle = unknown> {
  readonly name: string
  acquire(request: WorkspaceAcquireRequest): Promise<WorkspaceLease<Handle>>
}

/**
 * Another writer holds the workspace (AML's `AML_WORKSPACE_CONFLICT`,
 * recognized by AML's `WorkspaceConflictError.is` across SDK copies).
 */
export class WorkspaceConflictError extends Error {
  readonly code = "AML_WORKSPACE_CONFLICT"
  override readonly name = "WorkspaceConflictError"
  readonly workspaceId: string

  constructor(workspaceId: string, options?: ErrorOptions) {
    super(`Workspace "${workspaceId}" already has an active writer`, options)
    this.workspaceId = workspaceId
  }
}

/**
 * Another writer published since this lease loaded the workspace (a stale
 * publication): nothing was overwritten, and the tree is kept, mounted.
 */
export class WorkspacePublishConflictError extends Error {
  readonly code = "AML_PUBLISH_CONFLICT"
  override readonly name = "WorkspacePublishConflictError"
  readonly workspaceId: string

  constructor(workspaceId: string, options?: ErrorOptions) {
    super(`Workspace "${workspaceId}" was published by another writer since it was loaded`, options)
    this.workspaceId = workspaceId
  }
}

/** The revision asked for is not in the workspace's index (AML's wording). */
export class WorkspaceRevisionNotFoundError extends Error {
  readonly code = "REVISION_NOT_FOUND"
  override readonly name = "WorkspaceRevisionNotFoundError"
  readonly workspaceId: string
  readonly revision: string

  constructor(workspaceId: string, revision: string, options?: ErrorOptions) {
    super(`Workspace revision "${revision}" does not exist`, options)
    this.workspaceId = workspaceId
    this.revision = revision
  }
}

/** AML's filesystemWorkspace store: a directory on this host. */
export interface AmlfsFilesystemStore {
  readonly directory: string
}

/** AML's s3Workspace store: a bucket and a key prefix. */
export interface AmlfsS3Store {
  readonly bucket: string
  /** Default `aml/workspaces`, as s3Workspace's. */
  readonly prefix?: string
  /**
   * The S3 client's settings that amlfs, a process of its own, can take:
   * s3Workspace's `config` restated. Credentials may be a provider; without
   * them amlfs finds its own (environment, profile, instance role).
   */
  readonly config?: {
    readonly region?: string
    readonly endpoint?: string | URL
    readonly forcePathStyle?: boolean
    readonly credentials?: S3Credentials | (() => Promise<S3Credentials>)
  }
}

export interface S3Credentials {
  readonly accessKeyId: string
  readonly secretAccessKey: string
  readonly sessionToken?: string
}

export type AmlfsWorkspaceOptions = (AmlfsFilesystemStore | AmlfsS3Store) & {
  /** The format of the revisions saves write: `archive` (AML's default) or `folder`. */
  readonly format?: WorkspacePersistenceFormat
  readonly maxArchiveBytes?: number
  readonly maxEntries?: number
  /** The most bytes of files a revision may hold (amlfs's `--max-bytes`). */
  readonly maxExtractedBytes?: number
  /** Where the mount directories are made (default: the OS's temporary directory). */
  readonly temporaryDirectory?: string
  /** The amlfs binary (default: `amlfs` on PATH). */
  readonly amlfs?: string
  /** amlfs's `--cache-dir`, where working trees live (default: amlfs's). */
  readonly cacheDirectory?: string
  /** How the workspace is served (default `auto`: natively where it can run). */
  readonly serve?: "auto" | "fuse" | "native"
  /** `lazy` (default) is ready at once and fetches files on first use; `full` fetches first. */
  readonly restore?: "full" | "lazy"
  /** The sandbox's user (amlfs's `--sandbox-user`). */
  readonly sandboxUser?: string
  /** The amlfs processes' environment (default: this process's). */
  readonly env?: NodeJS.ProcessEnv
}

/** What a lease's handle tells a sandbox provider about its directory. */
export interface AmlfsWorkspaceHandle {
  readonly kind: "amlfs-workspace"
  /** The directory is an amlfs mount: bind-mount it, or mount amlfs itself with `mount`. */
  readonly mountpoint: string
  readonly workspaceId: string
  readonly store: string
  readonly format: WorkspacePersistenceFormat
  /** The revision the mount loaded; undefined for a new or empty workspace. */
  readonly revisionId?: string
  readonly serve: "fuse" | "native"
  /** The daemon's control socket (HTTP+JSON: commits, status, file tools). */
  readonly socket: string
  /** `amlfs mount` arguments, after the mountpoint, that mount this workspace elsewhere (without a lease: --no-lock is the caller's to add). */
  readonly mount: readonly string[]
}

interface Parsed {
  readonly store: string
  readonly storeArgs: readonly string[]
  readonly credentials: S3Credentials | (() => Promise<S3Credentials>) | undefined
  readonly region: string | undefined
  readonly format: WorkspacePersistenceFormat
  readonly limits: readonly string[]
  readonly temporaryDirectory: string
  readonly run: RunOptions
  readonly cacheDirectory: string | undefined
  readonly serve: string | undefined
  readonly restore: string | undefined
  readonly sandboxUser: string | undefined
}

/**
 * Creates an AML workspace provider backed by amlfs, with the store options
 * of filesystemWorkspace ({directory}) or s3Workspace ({bucket, prefix,
 * config}).
 */
export function amlfsWorkspace(options: AmlfsWorkspaceOptions): Readonly<WorkspaceProvider<AmlfsWorkspaceHandle>> {
  const parsed = parseOptions(options)
  const provider: WorkspaceProvider<AmlfsWorkspaceHandle> = {
    name: "amlfs",
    acquire: request => acquire(parsed, request),
  }
  return Object.freeze(provider)
}

function parseOptions(value: AmlfsWorkspaceOptions): Parsed {
  if (typeof value !== "object" || value === null) {
    throw new TypeError("amlfs Workspace options must be an object")
  }
  const normalized = (v: unknown, label: string): string => {
    if (typeof v !== "string" || v.length === 0 || v !== v.trim()) {
      throw new TypeError(`amlfs Workspace ${label} must be a non-empty normalized string`)
    }
    return v
  }
  let store: string
  const storeArgs: string[] = []
  let credentials: Parsed["credentials"] = undefined
  let region: string | undefined
  if ("directory" in value && value.directory !== undefined) {
    if ("bucket" in value) {
      throw new TypeError("amlfs Workspace takes directory or bucket, not both")
    }
    store = `file://${path.resolve(normalized(value.directory, "directory"))}`
  } else if ("bucket" in value) {
    const bucket = normalized(value.bucket, "bucket")
    const prefix = normalized(value.prefix ?? "aml/workspaces", "prefix")
    if (prefix.startsWith("/") || prefix.endsWith("/") || prefix.includes("//") || prefix.split("/").some(s => s === "." || s === "..")) {
      throw new TypeError("amlfs Workspace prefix must not start or end with /, or hold empty or traversal segments")
    }
    if ("client" in value) {
      throw new TypeError("amlfs Workspace cannot take an S3Client: amlfs is a process of its own; pass config")
    }
    store = `s3://${bucket}/${prefix}`
    const config = value.config ?? {}
    if (config.endpoint !== undefined) {
      storeArgs.push("--s3-endpoint", String(config.endpoint))
    }
    if (config.forcePathStyle === true) {
      storeArgs.push("--s3-path-style")
    }
    credentials = config.credentials
    if (config.region !== undefined) {
      region = normalized(config.region, "region")
    }
  } else {
    throw new TypeError("amlfs Workspace needs a directory or a bucket")
  }
  const format = value.format ?? "archive"
  if (format !== "archive" && format !== "folder") {
    throw new TypeError('amlfs Workspace format must be "archive" or "folder"')
  }
  const limits: string[] = []
  for (const [key, flag] of [
    ["maxArchiveBytes", "--max-archive-bytes"],
    ["maxEntries", "--max-entries"],
    ["maxExtractedBytes", "--max-bytes"],
  ] as const) {
    const n = value[key]
    if (n !== undefined) {
      if (!Number.isSafeInteger(n) || n <= 0) {
        throw new TypeError(`amlfs Workspace ${key} must be a positive safe integer`)
      }
      limits.push(flag, String(n))
    }
  }
  return Object.freeze({
    store,
    storeArgs,
    credentials,
    region,
    format,
    limits,
    temporaryDirectory: path.resolve(value.temporaryDirectory ?? os.tmpdir()),
    run: { ...(value.amlfs === undefined ? {} : { amlfs: value.amlfs }), ...(value.env === undefined ? {} : { env: value.env }) },
    cacheDirectory: value.cacheDirectory,
    serve: value.serve,
    restore: value.restore,
    sandboxUser: value.sandboxUser,
  })
}

/**
 * The environment of the amlfs commands: the S3 region and credentials, if
 * given (a provider of credentials is asked now), as the AWS SDK reads them.
 */
async function environment(p: Parsed): Promise<RunOptions> {
  if (p.credentials === undefined && p.region === undefined) {
    return p.run
  }
  const env: NodeJS.ProcessEnv = { ...(p.run.env ?? process.env) }
  if (p.region !== undefined) {
    env.AWS_REGION = p.region
  }
  if (p.credentials !== undefined) {
    const c = typeof p.credentials === "function" ? await p.credentials() : p.credentials
    env.AWS_ACCESS_KEY_ID = c.accessKeyId
    env.AWS_SECRET_ACCESS_KEY = c.secretAccessKey
    if (c.sessionToken === undefined) {
      delete env.AWS_SESSION_TOKEN
    } else {
      env.AWS_SESSION_TOKEN = c.sessionToken
    }
  }
  return { ...p.run, env }
}

async function acquire(p: Parsed, request: WorkspaceAcquireRequest): Promise<WorkspaceLease<AmlfsWorkspaceHandle>> {
  request.signal.throwIfAborted()
  const id = request.id
  if (typeof id !== "string" || id.length === 0 || id !== id.trim()) {
    throw new TypeError("Workspace id must be a non-empty normalized string")
  }
  const load = request.load
  // What the workspace is, wherever it is mounted: the handle's `mount`.
  const workspace = ["--store", p.store, ...p.storeArgs, "--id", id, "--format", p.format, ...p.limits]
  const args = [...workspace, "--save", "never"]
  let revision: string | undefined
  if (load === false) {
    args.push("--load", "none")
  } else if (load !== undefined) {
    if (load.revision !== "current") {
      revision = load.revision
      args.push("--load", load.revision)
    }
    for (const g of load.include ?? []) {
      args.push("--include", g)
    }
    for (const g of load.exclude) {
      args.push("--exclude", g)
    }
  }
  if (request.lock === false) {
    args.push("--no-lock")
  }
  for (const [flag, v] of [
    ["--cache-dir", p.cacheDirectory],
    ["--serve", p.serve],
    ["--restore", p.restore],
    ["--sandbox-user", p.sandboxUser],
  ] as const) {
    if (v !== undefined) {
      args.push(flag, v)
    }
  }
  const run = await environment(p)
  await mkdir(p.temporaryDirectory, { recursive: true })
  const leaseRoot = await mkdtemp(path.join(p.temporaryDirectory, "aml-amlfs-"))
  const directory = path.join(leaseRoot, "workspace")
  let mounted = false
  try {
    await mkdir(directory)
    // --json: the status once ready, from the same command.
    const result = await runCancellable(["mount", "--daemon", "--json", directory, ...args], run, request.signal, async () => {
      // A mount that went ahead is not left behind by a cancellation.
      await unmount(directory, run)
    })
    if (result.code !== 0) {
      throw mapError(cliError(result), id, revision)
    }
    mounted = true
    const status = JSON.parse(result.stdout) as MountStatus
    if (typeof status.socket !== "string" || status.socket === "") {
      throw new AmlfsError({ code: "AMLFS_FAILED", message: `amlfs mount names no control socket for ${directory}` })
    }
    const mount = new AmlfsMount(directory, status.socket)
    request.signal.throwIfAborted()
    return createLease(p, run, { directory, leaseRoot, mount, id, workspace, revisionId: status.baseRevision || undefined, serve: status.serve })
  } catch (cause) {
    const errors = await cleanup(mounted ? directory : undefined, leaseRoot, run)
    if (errors.length > 0) {
      throw new AggregateError([cause, ...errors], "amlfs Workspace acquisition and cleanup failed")
    }
    throw cause
  }
}

/**
 * Runs an amlfs command that the signal may cancel: on abort the command
 * is stopped, then undo runs once it ended, and the abort's reason is
 * thrown.
 */
async function runCancellable(args: string[], options: RunOptions, signal: AbortSignal, undo: () => Promise<void>) {
  try {
    return await run(args, { ...options, signal })
  } catch (error) {
    if (signal.aborted) {
      await undo().catch(() => {})
    }
    throw error
  }
}

/**
 * Unmounts without saving: the lease is freed, and the tree discarded, or
 * kept for the next acquisition of its revision if it is that revision exactly.
 */
async function unmount(directory: string, run: RunOptions): Promise<void> {
  await amlfs(["unmount", "--no-save", directory], run)
}

function mapError(error: AmlfsError, id: string, revision: string | undefined): Error {
  switch (error.code) {
    case "AML_WORKSPACE_CONFLICT":
      return new WorkspaceConflictError(id, { cause: error })
    case "AML_PUBLISH_CONFLICT":
      return new WorkspacePublishConflictError(id, { cause: error })
    case "REVISION_NOT_FOUND":
      return new WorkspaceRevisionNotFoundError(id, revision ?? "current", { cause: error })
    case "SAVE_FAILED":
      // A stale publication is a kind of save failure; its code is in the message.
      if (error.message.includes("AML_PUBLISH_CONFLICT")) {
        return new WorkspacePublishConflictError(id, { cause: error })
      }
      return error
    default:
      return error
  }
}

function createLease(
  p: Parsed,
  run: RunOptions,
  m: {
    readonly directory: string
    readonly leaseRoot: string
    readonly mount: AmlfsMount
    readonly id: string
    readonly workspace: readonly string[]
    readonly revisionId: string | undefined
    readonly serve: "fuse" | "native"
  }
): Readonly<WorkspaceLease<AmlfsWorkspaceHandle>> {
  let released: Promise<void> | undefined
  const handle: AmlfsWorkspaceHandle = Object.freeze({
    kind: "amlfs-workspace",
    mountpoint: m.directory,
    workspaceId: m.id,
    store: p.store,
    format: p.format,
    ...(m.revisionId === undefined ? {} : { revisionId: m.revisionId }),
    serve: m.serve,
    socket: m.mount.socket,
    mount: Object.freeze([...m.workspace]),
  })
  return Object.freeze({
    directory: m.directory,
    handle,
    id: `amlfs-${m.id}-${path.basename(m.leaseRoot)}`,
    release: () => {
      released ??= release(m.directory, m.leaseRoot, run)
      return released
    },
    save: async (request?: WorkspaceSaveRequest) => {
      request?.signal.throwIfAborted()
      if (released !== undefined) {
        throw new Error(`amlfs Workspace "${m.id}" was released`)
      }
      // AML decides from the outcome whether to save; a save asked for
      // is made whatever the outcome.
      const r: Omit<WorkspaceSaveRequest, "signal"> = request ?? { exclude: [], gitignore: true, outcome: "success", retention: 1 }
      try {
        await m.mount.commit(
          {
            include: r.include ?? [],
            exclude: r.exclude,
            gitignore: r.gitignore,
            retention: r.retention,
          },
          request?.signal
        )
      } catch (error) {
        throw AmlfsError.is(error) ? mapError(error, m.id, undefined) : error
      }
    },
  })
}

/**
 * Unmounts directory without saving (if given) and removes the lease's
 * directory; both are tried whatever failed, and their errors returned.
 */
async function cleanup(directory: string | undefined, leaseRoot: string, run: RunOptions): Promise<unknown[]> {
  const errors: unknown[] = []
  if (directory !== undefined) {
    try {
      await unmount(directory, run)
    } catch (error) {
      errors.push(error)
    }
  }
  try {
    await rm(leaseRoot, { force: true, recursive: true })
  } catch (error) {
    errors.push(error)
  }
  return errors
}

/** Unmounts without saving, freeing the lease, and removes the lease's directory. */
async function release(directory: string, leaseRoot: string, run: RunOptions): Promise<void> {
  const errors = await cleanup(directory, leaseRoot, run)
  if (errors.length === 1) {
    throw errors[0]
  }
  if (errors.length > 1) {
    throw new AggregateError(errors, "amlfs Workspace release failed")
  }
}
