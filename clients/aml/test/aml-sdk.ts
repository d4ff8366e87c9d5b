// What AML's workspace providers import from "@aml-jsx/sdk", taken from
// AML's own source (github.com/we-are-singular/aml, commit 4f497bd, MIT),
// vendored unchanged in third_party/aml and copied beside the tests by
// vendor.mjs. The SDK is not on the npm registry.
export { WorkspaceConflictError } from "./.aml/sdk/src/components/workspace/workspace-conflict-error.js"
export type * from "./.aml/sdk/src/components/workspace/workspace-provider.js"
export {
  createPersistentWorkspaceProvider,
  type PersistentWorkspaceHandle,
  type WorkspacePersistenceOptions,
} from "./.aml/sdk/src/workspace-persistence/workspace-persistence.js"
export type { WorkspacePersistenceFormat } from "./.aml/sdk/src/workspace-persistence/workspace-index.js"
export * from "./.aml/sdk/src/workspace-persistence/workspace-storage-adapter.js"
export { workspaceProviderConformance } from "./.aml/sdk/src/testing/workspace-provider-conformance.js"
