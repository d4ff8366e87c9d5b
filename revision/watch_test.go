package revision

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/amlfs/amlfs/revision/format"
)

// A tree that cannot be frozen (Options.Watch) is read again while it
// changes under the save, and the published revision is the first tree
// read with nothing changing; a tree that keeps changing is published
// after SaveAttempts attempts, marked Unsettled. The readings go to local
// staging: the store sees one upload.
func TestSaveWatch(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		for _, kind := range []string{format.FormatFolder, format.FormatArchive} {
			for _, tc := range []struct {
				name      string
				changing  int // attempts during which the tree changes
				attempts  int
				unsettled bool
			}{
				{"quiet", 0, 1, false},
				{"changed once", 1, 2, false},
				{"changed twice", 2, 3, false},
				{"always changing", 5, SaveAttempts, true},
			} {
				t.Run(kind+"/"+tc.name, func(t *testing.T) {
					ctx := context.Background()
					base, src := newBase(t, sk), t.TempDir()
					writeTree(t, src, map[string]string{"a/moving.txt": "m", "stay.txt": "s", "b/": ""})
					calls := 0
					w := openWS(t, base, "watched", Options{Format: kind, Watch: func() func() bool {
						calls++
						n := calls
						return func() bool {
							if n > tc.changing {
								return false
							}
							// A rename the attempt's read may have missed
							// half of: the file moves between directories.
							from, to := filepath.Join(src, "a", "moving.txt"), filepath.Join(src, "b", "moving.txt")
							if n%2 == 0 {
								from, to = to, from
							}
							if err := os.Rename(from, to); err != nil {
								t.Fatal(err)
							}
							return true
						}
					}})
					// However often it reads the tree, the save uploads
					// it once: its readings are copied locally.
					commits := 0
					if base.mem != nil {
						base.mem.Fail(func(op, key string) error {
							if op == "commit" {
								commits++
							}
							return nil
						})
						defer base.mem.Fail(nil)
					}
					res, err := w.Save(ctx, src, format.Selection{}, "rev-1")
					if err != nil {
						t.Fatal(err)
					}
					if base.mem != nil && commits != 1 {
						t.Errorf("the artifact was uploaded %d times, want once", commits)
					}
					if res.Attempts != tc.attempts || res.Unsettled != tc.unsettled || calls != tc.attempts {
						t.Fatalf("attempts %d (watch called %d times), unsettled %v; want %d, %v", res.Attempts, calls, res.Unsettled, tc.attempts, tc.unsettled)
					}
					w.Close(ctx)
					w2 := openWS(t, base, "watched", Options{Format: kind})
					dst := filepath.Join(t.TempDir(), "work")
					if _, err := w2.Restore(ctx, "current", dst, format.Selection{}); err != nil {
						t.Fatal(err)
					}
					// The settled revision is the tree as it was read last.
					want := "a"
					if min(tc.changing, tc.attempts)%2 == 1 {
						want = "b"
					}
					if tc.unsettled {
						// Read before the last move: where it was then.
						want = map[bool]string{true: "b", false: "a"}[(tc.attempts-1)%2 == 1]
					}
					for _, d := range []string{"a", "b"} {
						_, err := os.Stat(filepath.Join(dst, d, "moving.txt"))
						if (d == want) != (err == nil) {
							t.Errorf("%s/moving.txt: %v (the file was last read in %s/)", d, err, want)
						}
					}
				})
			}
		}
	})
}
