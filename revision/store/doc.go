// Package store defines what a durable workspace store is: one workspace's
// root (ROOT = base/seg(id)) with its index, published only on a matching
// version; revision artifacts written through a Stager and made visible at
// once by Commit; a single-writer Lease with a heartbeat; and foreign keys
// by which a fork reaches its source's objects.
//
// The stores are dirstore (a local directory), s3store (an S3 prefix) and
// memstore (in memory, for tests). storetest.Run is the conformance suite
// each of them passes.
//
// A Stager reads working-tree files at one instant (ReadStable) and reports
// each file's Stamp, so that the engine can tell an unchanged file later.
package store
