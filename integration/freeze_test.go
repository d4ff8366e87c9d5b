package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/amlfs/amlfs/revision/format"
)

// TestExecFreezesWriters: under amlfs exec the command runs in a cgroup of
// its own, which the daemon freezes while a checkpoint reads the tree. A
// background writer that rewrites a file in place without pause (as git's
// auto-gc or a database would) is frozen with it: each commit from inside
// the command reads the tree once, at one instant, and saves the file's
// current bytes (none saved "as in the previous revision"), whole. The
// cgroup is gone after the run. Through FUSE and natively.
func TestExecFreezesWriters(t *testing.T) {
	needCgroupV2(t)
	for _, serve := range []string{"fuse", "native"} {
		t.Run(serve, func(t *testing.T) {
			e := newEnv(t)
			if serve == "native" {
				needNative(t, e)
			}
			mp := filepath.Join(e.root, "mnt-freeze")
			out := filepath.Join(e.root, "commits")
			// The writer: one open descriptor, the file rewritten in
			// place with one version after another, nonstop.
			writer := `import os, sys
fd = os.open("busy", os.O_RDWR | os.O_CREAT, 0o644)
i = 0
while True:
    i += 1
    os.pwrite(fd, (("v%d " % i) * 200000).encode(), 0)
`
			script := fmt.Sprintf(`cat /proc/self/cgroup > %[1]s.cgroup
python3 -c '%[2]s' & W=$!
sleep 0.5
for n in 1 2 3; do %[3]s commit %[4]s >/dev/null && %[3]s status %[4]s --json >> %[1]s || exit 9; sleep 0.2; done
kill $W; wait $W 2>/dev/null; exit 0`, out, writer, amlfsBin, mp)
			args := append([]string{"exec"}, e.wsArgs("frz", "--serve", serve, "--retention", "5")...)
			r := e.amlfs(append(args, mp, "--", "sh", "-c", script)...)
			if isMounted(mp) {
				e.forceUnmount(mp)
			}
			if r.code != 0 {
				t.Fatalf("exec: %s", r)
			}
			cg, _ := os.ReadFile(out + ".cgroup")
			name := ""
			for _, l := range strings.Split(string(cg), "\n") {
				if rel, ok := strings.CutPrefix(l, "0::"); ok {
					name = filepath.Base(rel)
				}
			}
			if !strings.HasPrefix(name, "amlfs-exec-") {
				t.Fatalf("the command ran in cgroup %q, not one of its own", cg)
			}
			for _, root := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
				if _, err := os.Stat(filepath.Join(root, name)); err == nil {
					t.Errorf("the command's cgroup %s is left behind", name)
				}
			}
			data, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			dec := json.NewDecoder(strings.NewReader(string(data)))
			commits := 0
			for dec.More() {
				var st struct {
					LastSave struct {
						Revision string   `json:"revision"`
						Attempts int      `json:"attempts"`
						Earlier  []string `json:"earlier"`
						LeftOut  []string `json:"leftOut"`
						Warning  string   `json:"warning"`
					} `json:"lastSave"`
				}
				if err := dec.Decode(&st); err != nil {
					t.Fatal(err)
				}
				commits++
				ls := st.LastSave
				if len(ls.Earlier)+len(ls.LeftOut) > 0 || ls.Attempts > 1 || ls.Warning != "" {
					t.Errorf("commit %d was not of one instant: %+v", commits, ls)
				}
				// The file as saved: one version, whole.
				got := e.revisionFileAt(t, "frz", ls.Revision, "busy")
				if f := strings.Fields(got); len(f) == 0 || strings.Count(got, f[0]+" ") != len(f) {
					t.Errorf("commit %d: busy is torn or empty (%d bytes)", commits, len(got))
				}
			}
			if commits != 3 {
				t.Errorf("%d commits recorded, want 3", commits)
			}
		})
	}
}

// TestHeldSaveIsOneInstant: under amlfs exec, a checkpoint of a tree a
// writer keeps changing in two directories at once is the tree at one
// instant, though the writers are held only while the save reads again
// the directories changed since it began. The writer makes a/fN, then
// writes N to b/count (by rename): every revision with count N holds
// a/f1 to a/fN, and at most a/fN+1 beside them. A directory whose
// changes the daemon missed would be taken as the save first read it:
// a/ from one instant, b/ from another. Through FUSE and natively.
func TestHeldSaveIsOneInstant(t *testing.T) {
	needCgroupV2(t)
	for _, serve := range []string{"fuse", "native"} {
		t.Run(serve, func(t *testing.T) {
			e := newEnv(t)
			if serve == "native" {
				needNative(t, e)
			}
			mp := filepath.Join(e.root, "mnt-instant")
			out := filepath.Join(e.root, "revs")
			writer := `import os
os.makedirs("a", exist_ok=True); os.makedirs("b", exist_ok=True)
i = 0
while True:
    i += 1
    open("a/f%d" % i, "w").close()
    with open("b/count.tmp", "w") as f:
        f.write(str(i))
    os.rename("b/count.tmp", "b/count")
`
			script := fmt.Sprintf(`python3 -c '%[1]s' & W=$!
sleep 0.5
for n in 1 2 3 4; do %[2]s commit %[3]s >> %[4]s || exit 9; sleep 0.1; done
kill $W; wait $W 2>/dev/null; exit 0`, writer, amlfsBin, mp, out)
			args := append([]string{"exec"}, e.wsArgs("inst", "--serve", serve, "--retention", "5", "--max-entries", "1000000")...)
			r := e.amlfs(append(args, mp, "--", "sh", "-c", script)...)
			if isMounted(mp) {
				e.forceUnmount(mp)
			}
			if r.code != 0 {
				t.Fatalf("exec: %s", r)
			}
			data, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			revs := strings.Fields(string(data))
			if len(revs) != 4 {
				t.Fatalf("commits printed %q", data)
			}
			for _, rev := range revs {
				files := e.revisionFiles(t, "inst", rev)
				n, err := strconv.Atoi(files["b/count"])
				if err != nil {
					t.Fatalf("revision %s: b/count = %q", rev, files["b/count"])
				}
				var missing, extra []string
				for i := 1; i <= n; i++ {
					if _, ok := files[fmt.Sprintf("a/f%d", i)]; !ok {
						missing = append(missing, fmt.Sprint(i))
					}
				}
				for p := range files {
					if i, err := strconv.Atoi(strings.TrimPrefix(p, "a/f")); err == nil && i > n+1 {
						extra = append(extra, p)
					}
				}
				if len(missing)+len(extra) > 0 {
					t.Errorf("revision %s is not one instant: count %d, a/ lacks %d files (%.10v), holds %d past %d (%.10v)", rev, n, len(missing), missing, len(extra), n+1, extra)
				}
			}
		})
	}
}

// revisionFiles reads every file of revision rev of workspace id (an
// archive), straight from a file store.
func (e *env) revisionFiles(t *testing.T, id, rev string) map[string]string {
	t.Helper()
	cur, ok := readIndex(t, e, id).Find(rev)
	if !ok || cur.Format != format.FormatArchive {
		t.Fatalf("no archive revision %s of %s", rev, id)
	}
	files := map[string]string{}
	err := e.eachArchiveFile(id, cur, func(p string, r io.Reader) error {
		b, err := io.ReadAll(r)
		files[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// needCgroupV2 skips a test on a host with no cgroup v2 hierarchy, unified
// or hybrid (/sys/fs/cgroup/unified).
func needCgroupV2(t *testing.T) {
	t.Helper()
	for _, root := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err == nil {
			return
		}
	}
	t.Skip("no cgroup v2 hierarchy")
}
