// The real parts the tests run against: the amlfs binary (AMLFS_BIN, or
// built from this repository), and Versity's S3 gateway on loopback
// (AMLFS_VERSITYGW, as the Go integration suite uses it).
import { execFileSync, spawn, type ChildProcess } from "node:child_process"
import { existsSync } from "node:fs"
import { mkdir, mkdtemp, rm } from "node:fs/promises"
import net from "node:net"
import os from "node:os"
import path from "node:path"
import { fileURLToPath } from "node:url"

const repo = fileURLToPath(new URL("../../../", import.meta.url))

let built: string | undefined

/** The amlfs binary under test. */
export function amlfsBin(): string {
  const bin = process.env.AMLFS_BIN
  if (bin !== undefined && bin !== "") {
    return bin
  }
  if (built === undefined) {
    built = path.join(os.tmpdir(), `amlfs-clients-${process.pid}`)
    execFileSync("go", ["build", "-o", built, "./cmd/amlfs"], { cwd: repo, stdio: "inherit" })
  }
  return built
}

export const s3Access = "amlfsclient"
export const s3Secret = "amlfsclientsecret"

/**
 * The environment of amlfs and of AML's S3 client: loopback's plain http,
 * so no CA bundle, and no instance metadata.
 */
export function s3Env(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    AWS_ACCESS_KEY_ID: s3Access,
    AWS_SECRET_ACCESS_KEY: s3Secret,
    AWS_REGION: "us-east-1",
    AWS_EC2_METADATA_DISABLED: "true",
    AWS_CONFIG_FILE: "/dev/null",
    AWS_SHARED_CREDENTIALS_FILE: "/dev/null",
  }
  delete env.AWS_CA_BUNDLE
  return env
}

export interface S3Server {
  readonly endpoint: string
  readonly bucket: string
  readonly accessLog: string
  stop(): Promise<void>
}

async function freePort(): Promise<number> {
  return await new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.on("error", reject)
    srv.listen(0, "127.0.0.1", () => {
      const port = (srv.address() as net.AddressInfo).port
      srv.close(() => resolve(port))
    })
  })
}

/** Starts versitygw on 127.0.0.1 over a fresh directory, with one bucket. */
export async function startS3(): Promise<S3Server> {
  const bin = process.env.AMLFS_VERSITYGW ?? path.join(os.homedir(), ".cache", "amlfs-tools", "versitygw")
  if (!existsSync(bin)) {
    throw new Error(`versitygw not found at ${bin}: set AMLFS_VERSITYGW (.ci/run builds it)`)
  }
  const dir = await mkdtemp(path.join(os.tmpdir(), "amlfs-clients-s3-"))
  const bucket = "bkt"
  await mkdir(path.join(dir, "data", bucket), { recursive: true })
  const port = await freePort()
  const accessLog = path.join(dir, "access.log")
  const child: ChildProcess = spawn(
    bin,
    ["--port", `127.0.0.1:${port}`, "--access", s3Access, "--secret", s3Secret, "--access-log", accessLog, "posix", path.join(dir, "data")],
    { stdio: "ignore" }
  )
  for (let i = 0; ; i++) {
    const up = await new Promise<boolean>(resolve => {
      const c = net.connect(port, "127.0.0.1", () => {
        c.end()
        resolve(true)
      })
      c.on("error", () => resolve(false))
    })
    if (up) {
      break
    }
    if (i === 100) {
      child.kill()
      throw new Error("versitygw did not start")
    }
    await new Promise(r => setTimeout(r, 50))
  }
  return {
    endpoint: `http://127.0.0.1:${port}`,
    bucket,
    accessLog,
    async stop() {
      child.kill()
      await rm(dir, { force: true, recursive: true })
    },
  }
}

/** A fresh directory, removed by the returned function. */
export async function tempDir(prefix: string): Promise<[string, () => Promise<void>]> {
  const dir = await mkdtemp(path.join(os.tmpdir(), prefix))
  return [dir, () => rm(dir, { force: true, recursive: true })]
}
