// S3-compatible archive Workspace provider and materialization handle.
export { s3Workspace, type S3WorkspaceHandle, type S3WorkspaceOptions } from "./s3-workspace.js"
