// Package revision is amlfs's engine for a durable workspace in AML's
// store format (package format), kept in a store (package store):
//
//   - Workspace: open under a lease, restore, save in AML's order
//     (snapshot, limits, upload, conditional publication, prune), fork
//     and diff;
//   - lazy restore: placeholders whose bytes are fetched on first use, and
//     directories whose entries are made on first use (lazy.go,
//     lazydir.go);
//   - the stat data the mount shows for restored files (shown.go).
//
// A save reads the working tree beneath a descriptor of its root with no
// symlink followed (beneath.go, snapshot.go), each file at one instant
// (store.ReadStable).
package revision
