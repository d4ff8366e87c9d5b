package integration

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fuseOps is the count of FUSE requests the daemon served, by operation,
// by the metrics it exposes at url.
func fuseOps(t *testing.T, url string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for k, v := range scrape(t, url) {
		if op, ok := strings.CutPrefix(k, "amlfs_fuse_request_duration_seconds_count{"); ok {
			out[op] = v
		}
	}
	return out
}

// TestToolsOnTree: through FUSE, tool calls run on the working tree itself
// (no FUSE request reaches the daemon for them), and give what the mount
// would: a file a shell holds mapped and dirty is read with the shell's
// bytes, a symlink resolves into a live mount as the shell's does, a
// lazily restored tree is read through the mount until nothing is left
// to fetch, and a change is counted, so a checkpoint publishes it.
func TestToolsOnTree(t *testing.T) {
	e := newEnv(t)
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "x"), []byte("from the host"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	url := "http://" + addr + "/metrics"
	mp := e.mount("tree", "--serve", "fuse", "--mount", "/data=file://"+host, "--metrics-addr", addr)
	cl := toolClient(t, e, mp)
	sh(t, mp, "echo one > a.txt && mkdir -p d && echo two > d/b.txt && ln -s data/x to-host && cat a.txt d/b.txt >/dev/null")

	before := fuseOps(t, url)
	for range 20 {
		if m := tool(t, cl, "read_file", map[string]any{"path": "a.txt"}); m["content"] != "one\n" {
			t.Fatalf("read_file = %v", m["content"])
		}
		tool(t, cl, "file_stat", map[string]any{"path": "d/b.txt"})
		tool(t, cl, "list_files", map[string]any{"path": "d"})
	}
	tool(t, cl, "write_file", map[string]any{"path": "d/new.txt", "content": "made by a tool"})
	tool(t, cl, "edit_file", map[string]any{"path": "a.txt", "old_text": "one", "new_text": "uno"})
	for op, n := range fuseOps(t, url) {
		// The kernel forgets the inodes whose entries the tools' changes
		// dropped: not a request made for a call.
		if n != before[op] && !strings.Contains(op, "forget") {
			t.Errorf("%v FUSE requests %s served during 62 tool calls on the tree", n-before[op], op)
		}
	}
	// The shell sees the tools' changes at once, its caches warm.
	if got := sh(t, mp, "cat a.txt d/new.txt"); got != "uno\nmade by a tool" {
		t.Errorf("the shell reads %q", got)
	}

	// A symlink into a live mount resolves as the shell's does.
	if m := tool(t, cl, "read_file", map[string]any{"path": "to-host"}); m["content"] != "from the host" {
		t.Errorf("read_file through a symlink into a live mount = %v", m["content"])
	}

	// A shell that holds a file mapped, with dirty pages the mount has not
	// written back: the tool reads the shell's bytes. (With FUSE
	// passthrough the mapping is the backing file's own, so the tree has
	// them too; without it only the mount has them until writeback.)
	sh(t, mp, "head -c 8192 /dev/zero > m.bin")
	py := exec.Command("python3", "-c", `import mmap, sys, time
f = open(sys.argv[1], "r+b")
m = mmap.mmap(f.fileno(), 0)
m[0:5] = b"DIRTY"
print("mapped", flush=True)
time.sleep(60)`, filepath.Join(mp, "m.bin"))
	out, err := py.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := py.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { py.Process.Kill(); py.Wait() }()
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "mapped\n" {
		t.Fatalf("python: %q", line)
	}
	m := tool(t, cl, "read_file", map[string]any{"path": "m.bin"})
	if enc, _ := m["encoding"].(string); enc != "base64" {
		t.Fatalf("read_file of a binary file: %v", m["encoding"])
	}
	if !strings.HasPrefix(m["content"].(string), "RElSVFk") { // base64 of DIRTY
		t.Errorf("read_file of a mapped, dirty file: %.20s…, want the shell's bytes", m["content"])
	}
	py.Process.Kill()
	py.Wait()

	// A tool's change counts: the checkpoint publishes it, and a fresh
	// mount of that revision holds it.
	first := strings.TrimSpace(e.amlfs("commit", mp).stdout)
	tool(t, cl, "write_file", map[string]any{"path": "after.txt", "content": "after the first checkpoint"})
	r := e.amlfs("commit", mp)
	if second := strings.TrimSpace(r.stdout); r.code != 0 || second == first {
		t.Fatalf("a checkpoint after a tool's change: %s (first %s)", r, first)
	}
	e.unmount(mp)
	mp2 := e.mount("tree", "--serve", "fuse", "--restore", "lazy", "--prefetch", "0")
	cl2 := toolClient(t, e, mp2)
	// Lazily restored, nothing fetched: the tools read through the mount,
	// which fetches on first use.
	for p, want := range map[string]string{"after.txt": "after the first checkpoint", "d/new.txt": "made by a tool", "a.txt": "uno\n"} {
		if m := tool(t, cl2, "read_file", map[string]any{"path": p}); m["content"] != want {
			t.Errorf("read_file %s on a lazy tree = %v", p, m["content"])
		}
	}
	if got := sh(t, mp2, "cat after.txt"); got != "after the first checkpoint" {
		t.Errorf("cat after.txt = %q", got)
	}
}
