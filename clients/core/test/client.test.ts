// The client's own parts that need no daemon: reading amlfs's errors.
import assert from "node:assert/strict"
import { test } from "node:test"

import { AmlfsError, cliError } from "../src/index.js"

test("a command's error is its code word, path, message and exit status", () => {
  const cases: [string, number, Partial<AmlfsError>][] = [
    [
      'amlfs: AML_WORKSPACE_CONFLICT w: workspace "w" is locked by another writer\n',
      3,
      { code: "AML_WORKSPACE_CONFLICT", path: "w", message: 'AML_WORKSPACE_CONFLICT: workspace "w" is locked by another writer', exitCode: 3 },
    ],
    ["amlfs: REVISION_NOT_FOUND nope: no such revision in file:///s/w\n", 1, { code: "REVISION_NOT_FOUND", path: "nope", exitCode: 1 }],
    ["some note\namlfs: INVALID_CONFIG --serve: serve must be native, fuse or auto\n", 2, { code: "INVALID_CONFIG", path: "--serve", exitCode: 2 }],
    ["panic: something\n", 2, { code: "AMLFS_FAILED", message: "AMLFS_FAILED: panic: something", exitCode: 2 }],
  ]
  for (const [stderr, code, want] of cases) {
    const e = cliError({ code, stdout: "", stderr })
    for (const [k, v] of Object.entries(want)) {
      assert.equal((e as unknown as Record<string, unknown>)[k], v, `${k} of ${stderr}`)
    }
    assert.ok(AmlfsError.is(e, want.code))
  }
})
