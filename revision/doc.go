// Package revision is amlfs's durable workspace in AML's store format:
//
//   - the format: the index (workspace.json), folder manifests and archive
//     revisions, the id segment, and the include, exclude and .gitignore
//     selection (index.go, manifest.go, archive.go, seg.go, selection.go);
//   - the stores, a directory (fsstore.go) and S3 (s3store.go), each with
//     its single-writer lease (fslock.go, s3lock.go) and conditional
//     publication of the index;
//   - the engine (Workspace): open under a lease, restore, save in AML's
//     order (snapshot, limits, upload, conditional publication, prune),
//     fork and diff;
//   - lazy restore: placeholders whose bytes are fetched on first use, and
//     directories whose entries are made on first use (lazy.go,
//     lazydir.go).
//
// A save reads the working tree beneath a descriptor of its root with no
// symlink followed (beneath.go), each file at one instant (stable.go).
package revision
