package revision

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amlfs/amlfs/revision/format"
)

// TestDiff saves two revisions of a known tree, in each format, and checks
// the changes Diff finds: added, removed, and changed by size, by content
// at the same size, by mode, and by type; unchanged files (reused on
// save, or not) are not listed.
func TestDiff(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		for _, kind := range []string{format.FormatFolder, format.FormatArchive} {
			t.Run(kind, func(t *testing.T) {
				ctx := context.Background()
				base, src := newBase(t, sk), t.TempDir()
				w := openWS(t, base, "d", Options{Format: kind, Retention: 2})
				writeTree(t, src, map[string]string{
					"same.txt": "unchanged", "grow.txt": "short", "swap.txt": "aaaa", "mode.sh": "#!/bin/sh",
					"gone.txt": "bye", "dir/x": "x", "becomes/y": "y",
				})
				r1, err := w.Save(ctx, src, format.Selection{}, "r1")
				if err != nil {
					t.Fatal(err)
				}
				os.WriteFile(filepath.Join(src, "grow.txt"), []byte("much longer now"), 0o644)
				os.WriteFile(filepath.Join(src, "swap.txt"), []byte("bbbb"), 0o644)
				os.Chmod(filepath.Join(src, "mode.sh"), 0o755)
				os.Remove(filepath.Join(src, "gone.txt"))
				os.WriteFile(filepath.Join(src, "new.txt"), []byte("hello"), 0o644)
				os.RemoveAll(filepath.Join(src, "becomes"))
				os.WriteFile(filepath.Join(src, "becomes"), []byte("now a file"), 0o644)
				r2, err := w.Save(ctx, src, format.Selection{}, "r2")
				if err != nil {
					t.Fatal(err)
				}
				changes, err := w.Diff(ctx, r1.Entry, r2.Entry)
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, c := range changes {
					got = append(got, fmt.Sprintf("%s %s %d->%d %o->%o", c.Kind, c.Path, c.OldSize, c.NewSize, c.OldMode, c.NewMode))
				}
				want := []string{
					"changed becomes 0->10 755->644",
					"removed becomes/y 1->0 644->0",
					"removed gone.txt 3->0 644->0",
					"changed grow.txt 5->15 644->644",
					"changed mode.sh 9->9 644->755",
					"added new.txt 0->5 0->644",
					"changed swap.txt 4->4 644->644",
				}
				if strings.Join(got, "\n") != strings.Join(want, "\n") {
					t.Errorf("diff:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
				// A revision against itself: nothing.
				if c, err := w.Diff(ctx, r2.Entry, r2.Entry); err != nil || len(c) != 0 {
					t.Errorf("self diff: %v %v", c, err)
				}
			})
		}
	})
}
