package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestResumeIsAStaleWriter: a tree whose save failed because another writer
// published in between is kept, and resuming it is a stale writer too: the
// remount warns, its save fails with AML_PUBLISH_CONFLICT (exit 3) and
// overwrites nothing, and --discard-unsaved restores the other writer's
// revision. The other writer is an amlfs --no-lock mount on another host
// (which also prunes the base, retention 1), or a plain workspace.json swap
// as AML makes it.
func TestResumeIsAStaleWriter(t *testing.T) { forEachStore(t, testResumeIsAStaleWriter) }

func testResumeIsAStaleWriter(t *testing.T, newEnv func(*testing.T) *env) {
	for _, other := range []string{"amlfs", "swap"} {
		t.Run(other, func(t *testing.T) {
			e := newEnv(t)
			id := "stale-" + other
			mp := e.mount(id)
			sh(t, mp, "echo base > base")
			if r := e.unmount(mp); r.code != 0 {
				t.Fatalf("first save: %s", r)
			}
			mp = e.mount(id)
			sh(t, mp, "echo mine > mine")
			theirs := publishBehind(t, e, id, other)
			r := e.unmount(mp)
			if r.code != 3 || !strings.Contains(r.stderr, "AML_PUBLISH_CONFLICT") {
				t.Fatalf("save after another writer published: %s", r)
			}
			// Resumed, the tree is still a stale writer.
			r = e.mountAt(mp, id)
			if r.code != 0 || !strings.Contains(r.stderr, "resuming unsaved work") || !strings.Contains(r.stderr, "another writer published since") {
				t.Fatalf("resume: %s", r)
			}
			if got := readFile(t, filepath.Join(mp, "mine")); got != "mine\n" {
				t.Errorf("resumed tree: mine = %q", got)
			}
			r = e.unmount(mp)
			if r.code != 3 || !strings.Contains(r.stderr, "AML_PUBLISH_CONFLICT") || !strings.Contains(r.stderr, "--discard-unsaved") {
				t.Fatalf("save of the resumed tree: %s", r)
			}
			if cur := e.currentRevision(id); cur != theirs {
				t.Fatalf("the resumed tree's save moved current from %s to %s", theirs, cur)
			}
			// And again: the state file still says what the tree is based on.
			mp = e.mount(id)
			if r := e.unmount(mp); r.code != 3 {
				t.Fatalf("second resume's save: %s", r)
			}
			mp = e.mount(id, "--discard-unsaved")
			if !fileExists(filepath.Join(mp, "theirs")) || fileExists(filepath.Join(mp, "mine")) {
				t.Errorf("--discard-unsaved did not restore the other writer's revision")
			}
			if r := e.unmount(mp); r.code != 0 {
				t.Fatalf("unmount: %s", r)
			}
		})
	}
}

// publishBehind publishes a revision of workspace id holding "theirs", as
// another writer, and returns its id.
func publishBehind(t *testing.T, e *env, id, how string) string {
	t.Helper()
	if how == "amlfs" {
		h := e.host(t)
		m := h.mount(id, "--no-lock")
		sh(t, m, "echo theirs > theirs")
		r := h.unmount(m)
		if r.code != 0 {
			t.Fatalf("the other writer's save: %s", r)
		}
		return strings.TrimSpace(r.stdout)
	}
	// As AML's saveRevision does: the artifact, then the index.
	rev := fmt.Sprintf("aml-%d", time.Now().UnixNano())
	base := id + "/revisions/" + rev + "/"
	e.putStoreFile(base+"files/theirs", []byte("theirs\n"))
	e.putStoreFile(base+"manifest.json", []byte(`{"entries":[{"mode":420,"path":"theirs","size":7,"type":"file"}],"version":1}`))
	e.putStoreFile(id+"/workspace.json", []byte(`{"current":"`+rev+`","revisions":[{"createdAt":"`+time.Now().UTC().Format("2006-01-02T15:04:05.000Z")+`","format":"folder","id":"`+rev+`","path":"revisions/`+rev+`/"}],"version":1}`))
	if _, err := os.Stat(filepath.Join(e.storeD, id, "workspace.json")); err != nil {
		t.Fatal(err)
	}
	return rev
}

// TestSaveWithoutItsBase: an unchanged file whose object in the base
// revision is gone (pruned by another writer between the save's index check
// and its copy, or deleted by a bucket rule) is uploaded from the tree, and
// the save says so; the next revision is whole.
func TestSaveWithoutItsBase(t *testing.T) { forEachStore(t, testSaveWithoutItsBase) }

func testSaveWithoutItsBase(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	e.folder() // a test of the folder layout
	mp := e.mount("nobase")
	sh(t, mp, "echo seed > seed.txt && echo keep > keep.txt")
	r := e.amlfs("commit", mp)
	if r.code != 0 {
		t.Fatalf("commit: %s", r)
	}
	rev := strings.TrimSpace(r.stdout)
	must(t, os.Remove(filepath.Join(e.storeD, "nobase", "revisions", rev, "files", "seed.txt")))
	sh(t, mp, "echo live > live.txt")
	if r := e.amlfs("commit", mp); r.code != 0 {
		t.Fatalf("commit without a base object: %s", r)
	}
	st := e.amlfs("status", mp, "--json").stdout
	if !strings.Contains(st, `"baseGone": 1`) || !strings.Contains(st, `"reused": 1`) {
		t.Errorf("status: %s", st)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	e.verifyCurrent(t, "nobase", map[string][]byte{"seed.txt": []byte("seed\n"), "keep.txt": []byte("keep\n"), "live.txt": []byte("live\n")})
}

// TestPlaceholderWithoutItsBase: a lazily restored file whose object is gone
// from the store before it was fetched reads as EIO, and the log says why;
// a save of the tree fails with BASE_REVISION_GONE, publishes nothing, and
// never uploads the placeholder's empty bytes in place of the real ones.
func TestPlaceholderWithoutItsBase(t *testing.T) { forEachStore(t, testPlaceholderWithoutItsBase) }

func testPlaceholderWithoutItsBase(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	e.folder() // a test of the folder layout
	mp := e.mount("gone")
	sh(t, mp, "echo one > one.txt && echo two > two.txt")
	r := e.unmount(mp)
	if r.code != 0 {
		t.Fatalf("save: %s", r)
	}
	rev := strings.TrimSpace(r.stdout)
	h := e.host(t)
	mp = h.mount("gone", "--prefetch", "0")
	must(t, os.Remove(filepath.Join(e.storeD, "gone", "revisions", rev, "files", "one.txt")))
	status := func() (gone int, health string) {
		var st struct {
			GoneFiles int    `json:"goneFiles"`
			Health    string `json:"health"`
		}
		must(t, json.Unmarshal([]byte(h.amlfs("status", mp, "--json").stdout), &st))
		return st.GoneFiles, st.Health
	}
	if n, health := status(); n != 0 || health != "ok" {
		t.Errorf("status before any read: %d gone files, health %q", n, health)
	}
	for range 3 {
		if _, err := os.ReadFile(filepath.Join(mp, "one.txt")); err == nil || !strings.Contains(err.Error(), "input/output error") {
			t.Errorf("read of a placeholder whose object is gone: %v", err)
		}
	}
	// One log line for the three reads, naming the object and why.
	logs, _ := filepath.Glob(filepath.Join(h.runtime, "*.log"))
	var lines []string
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "fetch file bytes") && strings.Contains(line, "one.txt") {
				lines = append(lines, line)
			}
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "revision "+rev+" was pruned") || !strings.Contains(lines[0], "revisions/"+rev+"/files/one.txt") {
		t.Errorf("want one log line naming the object and the pruned revision, got %d:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	if n, health := status(); n != 1 || !strings.Contains(health, "another writer pruned") {
		t.Errorf("status after the failed reads: %d gone files, health %q", n, health)
	}
	sh(t, mp, "echo three > three.txt")
	r = h.amlfs("commit", mp)
	if r.code != 4 || !strings.Contains(r.stderr, "BASE_REVISION_GONE") {
		t.Errorf("commit of a tree with a placeholder whose object is gone: %s", r)
	}
	if cur := e.currentRevision("gone"); cur != rev {
		t.Errorf("current moved from %s to %s", rev, cur)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.storeD, "gone", "revisions")); len(ents) != 1 {
		out, _ := exec.Command("find", filepath.Join(e.storeD, "gone", "revisions")).CombinedOutput()
		t.Errorf("the failed save left %d artifacts:\n%s", len(ents), out)
	}
	// The remedy the health line names: remove it, and all is well.
	must(t, os.Remove(filepath.Join(mp, "one.txt")))
	if n, health := status(); n != 0 || health != "ok" {
		t.Errorf("status after the gone file was removed: %d gone files, health %q", n, health)
	}
	if r := h.amlfs("commit", mp); r.code != 0 {
		t.Errorf("commit after the gone file was removed: %s", r)
	}
	if b, err := os.ReadFile(filepath.Join(mp, "two.txt")); err != nil || string(b) != "two\n" {
		t.Errorf("two.txt: %q %v", b, err)
	}
	h.unmount(mp, "--no-save")
}

// TestUnchangedUnmountReportsTheStore: an unchanged tree saves nothing at
// unmount, and reports the revision the store names current, read back,
// not the one the mount remembers.
func TestUnchangedUnmountReportsTheStore(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("report")
	sh(t, mp, "echo a > a")
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save: %s", r)
	}
	mp = e.mount("report")
	theirs := publishBehind(t, e, "report", "swap")
	r := e.unmount(mp)
	if r.code != 0 || strings.TrimSpace(r.stdout) != theirs || !strings.Contains(r.stderr, "another writer published") {
		t.Fatalf("unmount of an unchanged tree after another writer published %s: %s", theirs, r)
	}
}
