/**
 * @amlfs/client drives amlfs from TypeScript. The command line mounts a
 * workspace (`amlfs mount --daemon`); each running daemon serves HTTP+JSON
 * on its control socket, which commits, unmounts and answers the file
 * tools. The AML workspace provider and the Mastra filesystem are built on
 * it.
 */
import { spawn } from "node:child_process"
import http from "node:http"

/** The error object amlfs answers with, on its socket and its command line. */
export interface AmlfsErrorBody {
  readonly code: string
  readonly message: string
  readonly path?: string
  readonly exitCode?: number
}

/**
 * An error amlfs reported: `code` is its code word (`AML_WORKSPACE_CONFLICT`,
 * `ENOENT`, `NO_MATCH`, ...), as in amlfs's error table (docs/cli.md).
 */
export class AmlfsError extends Error {
  readonly code: string
  readonly path: string | undefined
  readonly exitCode: number | undefined
  /** The HTTP status of a socket call; undefined for the command line. */
  readonly status: number | undefined

  constructor(body: AmlfsErrorBody, status?: number) {
    super(body.message === "" ? body.code : `${body.code}: ${body.message}`)
    this.name = "AmlfsError"
    this.code = body.code
    this.path = body.path === "" ? undefined : body.path
    this.exitCode = body.exitCode
    this.status = status
  }

  static is(value: unknown, code?: string): value is AmlfsError {
    return value instanceof AmlfsError && (code === undefined || value.code === code)
  }
}

export interface RunOptions {
  /** The amlfs binary (default: `amlfs` on PATH). */
  readonly amlfs?: string
  /** The environment of the command (default: this process's). */
  readonly env?: NodeJS.ProcessEnv
  /** Ends the command (SIGTERM) and rejects with the signal's reason. */
  readonly signal?: AbortSignal
}

export interface RunResult {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

/** Runs `amlfs ARGS...` to its end, whatever its exit status. */
export function run(args: readonly string[], options: RunOptions = {}): Promise<RunResult> {
  options.signal?.throwIfAborted()
  return new Promise((resolve, reject) => {
    const child = spawn(options.amlfs ?? "amlfs", args, {
      env: options.env ?? process.env,
      stdio: ["ignore", "pipe", "pipe"],
    })
    const out: Buffer[] = []
    const err: Buffer[] = []
    child.stdout.on("data", (b: Buffer) => out.push(b))
    child.stderr.on("data", (b: Buffer) => err.push(b))
    const abort = () => child.kill("SIGTERM")
    options.signal?.addEventListener("abort", abort, { once: true })
    child.on("error", error => {
      options.signal?.removeEventListener("abort", abort)
      reject(error)
    })
    child.on("close", (code, signal) => {
      options.signal?.removeEventListener("abort", abort)
      if (options.signal?.aborted) {
        reject(options.signal.reason)
        return
      }
      resolve({
        code: code ?? (signal === null ? 1 : 128),
        stdout: Buffer.concat(out).toString("utf8"),
        stderr: Buffer.concat(err).toString("utf8"),
      })
    })
  })
}

/** Runs `amlfs ARGS...`; a failure rejects with its AmlfsError. */
export async function amlfs(args: readonly string[], options: RunOptions = {}): Promise<string> {
  const result = await run(args, options)
  if (result.code !== 0) {
    throw cliError(result)
  }
  return result.stdout
}

const CLI_ERROR = /^amlfs: ([A-Z][A-Z0-9_]+) (?:(.*?): )?(.*)$/m

/**
 * The error a failed command printed: `amlfs: CODE PATH: MESSAGE` on
 * stderr, and its exit status.
 */
export function cliError(result: RunResult): AmlfsError {
  const m = CLI_ERROR.exec(result.stderr)
  if (m === null) {
    const message = result.stderr.trim().split("\n").at(-1) ?? ""
    return new AmlfsError({ code: "AMLFS_FAILED", exitCode: result.code, message: message.replace(/^amlfs: /, "") })
  }
  return new AmlfsError({
    code: m[1]!,
    exitCode: result.code,
    message: m[3]!,
    ...(m[2] === undefined ? {} : { path: m[2] }),
  })
}

/** What `GET /v1/status` answers (the fields these packages use). */
export interface MountStatus {
  readonly id: string
  readonly store: string
  readonly mountpoint: string
  readonly socket: string
  readonly pid: number
  readonly phase: string
  readonly serve: "native" | "fuse"
  readonly serveWhy: string
  readonly currentRevision: string
  readonly baseRevision: string
  readonly dirty: boolean
  readonly pendingFiles: number
  readonly lock: string
}

/** A commit's selection and retention, for this commit only. */
export interface CommitRequest {
  /** Names the revision; a retried commit with the same id converges on one revision. */
  readonly revision?: string
  readonly include?: readonly string[]
  readonly exclude?: readonly string[]
  readonly gitignore?: boolean
  readonly retention?: number
}

export interface SaveInfo {
  readonly revision: string
  readonly at: string
  readonly files: number
  readonly bytes: number
  readonly seconds: number
  readonly skipped?: boolean
}

/**
 * A running amlfs daemon, reached through its control socket (mode 0600:
 * only the daemon's user may call it).
 */
export class AmlfsMount {
  readonly mountpoint: string
  readonly socket: string

  constructor(mountpoint: string, socket: string) {
    this.mountpoint = mountpoint
    this.socket = socket
  }

  /** Finds the daemon serving mountpoint (`amlfs status --json`). */
  static async connect(mountpoint: string, options: RunOptions = {}): Promise<AmlfsMount> {
    return (await AmlfsMount.find(mountpoint, options)).mount
  }

  /** connect, with the status it read. */
  static async find(mountpoint: string, options: RunOptions = {}): Promise<{ mount: AmlfsMount; status: MountStatus }> {
    const status = JSON.parse(await amlfs(["status", mountpoint, "--json"], options)) as MountStatus
    if (typeof status.socket !== "string" || status.socket === "") {
      throw new AmlfsError({ code: "AMLFS_FAILED", message: `amlfs status names no control socket for ${mountpoint}` })
    }
    return { mount: new AmlfsMount(mountpoint, status.socket), status }
  }

  /** One HTTP+JSON call; an error answer rejects with its AmlfsError. */
  request<T>(method: "GET" | "POST", path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
    signal?.throwIfAborted()
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body))
    return new Promise((resolve, reject) => {
      const req = http.request(
        {
          socketPath: this.socket,
          method,
          path,
          headers: payload === undefined ? {} : { "content-type": "application/json", "content-length": payload.length },
          ...(signal === undefined ? {} : { signal }),
        },
        res => {
          const chunks: Buffer[] = []
          res.on("data", (b: Buffer) => chunks.push(b))
          res.on("error", reject)
          res.on("end", () => {
            const text = Buffer.concat(chunks).toString("utf8")
            let value: unknown
            try {
              value = text === "" ? undefined : JSON.parse(text)
            } catch {
              reject(new AmlfsError({ code: "AMLFS_FAILED", message: `${method} ${path}: not JSON: ${text.slice(0, 200)}` }, res.statusCode))
              return
            }
            const error = (value as { error?: AmlfsErrorBody } | undefined)?.error
            if ((res.statusCode ?? 500) >= 400 || error !== undefined) {
              reject(new AmlfsError(error ?? { code: "AMLFS_FAILED", message: `${method} ${path}: HTTP ${res.statusCode}` }, res.statusCode))
              return
            }
            resolve(value as T)
          })
        }
      )
      req.on("error", error => reject(signal?.aborted === true ? signal.reason : error))
      req.end(payload)
    })
  }

  status(signal?: AbortSignal): Promise<MountStatus> {
    return this.request("GET", "/v1/status", undefined, signal)
  }

  /**
   * Checkpoints the tree as a revision. A selection given here is this
   * commit's whole selection: an include or exclude left out is empty.
   */
  commit(request: CommitRequest = {}, signal?: AbortSignal): Promise<SaveInfo> {
    const selects = request.include !== undefined || request.exclude !== undefined
    return this.request(
      "POST",
      "/v1/commit",
      {
        ...(request.revision === undefined ? {} : { revision: request.revision }),
        ...(selects ? { include: request.include ?? [], exclude: request.exclude ?? [] } : {}),
        ...(request.gitignore === undefined ? {} : { gitignore: request.gitignore }),
        ...(request.retention === undefined ? {} : { retention: request.retention }),
      },
      signal
    )
  }

  /** Calls a file tool (docs/tools.md): the same tools the MCP server serves. */
  tool<T>(name: string, args: Record<string, unknown>, signal?: AbortSignal): Promise<T> {
    return this.request("POST", `/v1/tools/${encodeURIComponent(name)}`, args, signal)
  }
}
