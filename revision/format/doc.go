// Package format is AML's store format, with no I/O of its own: the
// index (workspace.json), folder manifests and their amlfs extension,
// archive revisions (a gzip-compressed tar read and written as a stream),
// the workspace id's path segment, and the include, exclude and hidden
// rules of a selection. Every parser here takes untrusted bytes, checks
// them against AML's rules and the revision limits, and is fuzzed.
package format
