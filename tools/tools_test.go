package tools

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func setup(t *testing.T) (*FS, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	os.MkdirAll(filepath.Join(root, "dir/sub"), 0o755)
	os.WriteFile(filepath.Join(root, "a.txt"), []byte("one\ntwo\nthree\n"), 0o600)
	os.WriteFile(filepath.Join(root, "dir/b.go"), []byte("package b\n// TODO fix\n"), 0o644)
	os.WriteFile(filepath.Join(root, "dir/sub/c.go"), []byte("package c\n// TODO later\n"), 0o644)
	os.WriteFile(filepath.Join(root, "bin"), []byte{0, 1, 2, 0xff}, 0o644)
	os.WriteFile(filepath.Join(filepath.Dir(root), "secret"), []byte("outside"), 0o644)
	os.Symlink("../secret", filepath.Join(root, "escape"))
	os.Symlink("/etc/passwd", filepath.Join(root, "abs"))
	os.Symlink("a.txt", filepath.Join(root, "inside"))
	return New(root, "/"), root
}

func call(t *testing.T, fs *FS, name, args string) (map[string]any, *Error) {
	t.Helper()
	out, err := fs.Call(context.Background(), name, json.RawMessage(args))
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("%s %s: untyped error %v", name, args, err)
		}
		return nil, e
	}
	data, _ := json.Marshal(out)
	var m map[string]any
	json.Unmarshal(data, &m)
	return m, nil
}

func TestErrorsChangeNothing(t *testing.T) {
	for _, tc := range []struct {
		name, tool, args, code string
	}{
		{"dotdot", "read_file", `{"path":"../secret"}`, CodeEscape},
		{"dotdot deep", "write_file", `{"path":"dir/../../x","content":"x"}`, CodeEscape},
		{"symlink out", "read_file", `{"path":"escape"}`, CodeEscape},
		{"absolute symlink", "read_file", `{"path":"/abs"}`, CodeEscape},
		{"write through symlink out", "write_file", `{"path":"escape/x","content":"x"}`, CodeEscape},
		{"missing", "read_file", `{"path":"nope"}`, "ENOENT"},
		{"read dir", "read_file", `{"path":"dir"}`, "EISDIR"},
		{"no match", "edit_file", `{"path":"a.txt","old_text":"four","new_text":"4"}`, CodeNoMatch},
		{"two matches", "edit_file", `{"path":"dir/sub/c.go","old_text":"c","new_text":"d"}`, CodeManyMatch},
		{"no overwrite", "write_file", `{"path":"a.txt","content":"x","overwrite":false}`, "EEXIST"},
		{"malformed", "write_file", `{"path":"a.txt","content":`, CodeInvalid},
		{"unknown field", "read_file", `{"path":"a.txt","bogus":1}`, CodeInvalid},
		{"missing path", "file_stat", `{}`, CodeInvalid},
		{"rmdir full", "delete", `{"path":"dir"}`, "ENOTEMPTY"},
		{"bad regexp", "grep", `{"pattern":"("}`, CodeInvalid},
		{"unknown tool", "chmod", `{}`, CodeUnknown},
		{"delete root", "delete", `{"path":"/"}`, CodeInvalid},
		{"mkdir over file", "mkdir", `{"path":"a.txt/x"}`, "ENOTDIR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, root := setup(t)
			before := snapshot(t, filepath.Dir(root))
			_, e := call(t, fs, tc.tool, tc.args)
			if e == nil || e.Code != tc.code {
				t.Fatalf("error %v, want code %s", e, tc.code)
			}
			if after := snapshot(t, filepath.Dir(root)); after != before {
				t.Fatalf("a failed call changed the tree:\n%s\n---\n%s", before, after)
			}
		})
	}
}

func snapshot(t *testing.T, dir string) string {
	var b strings.Builder
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		b.WriteString(p + " " + fi.Mode().String())
		if fi.Mode().IsRegular() {
			data, _ := os.ReadFile(p)
			b.WriteString(" " + string(data))
		}
		b.WriteString("\n")
		return nil
	})
	return b.String()
}

func TestReadFile(t *testing.T) {
	fs, _ := setup(t)
	m, e := call(t, fs, "read_file", `{"path":"/a.txt","offset":2,"limit":1}`)
	if e != nil || m["content"] != "two\n" || m["totalLines"] != 3.0 || m["truncated"] != true {
		t.Fatalf("%v %v", m, e)
	}
	m, _ = call(t, fs, "read_file", `{"path":"inside"}`)
	if m["content"] != "one\ntwo\nthree\n" {
		t.Fatalf("through an inside symlink: %v", m)
	}
	m, _ = call(t, fs, "read_file", `{"path":"bin"}`)
	if m["encoding"] != "base64" || m["content"] != base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 0xff}) {
		t.Fatalf("binary: %v", m)
	}
}

func TestWriteEditDelete(t *testing.T) {
	fs, root := setup(t)
	if _, e := call(t, fs, "write_file", `{"path":"new/deep/f.txt","content":"hello"}`); e != nil {
		t.Fatal(e)
	}
	if data, _ := os.ReadFile(filepath.Join(root, "new/deep/f.txt")); string(data) != "hello" {
		t.Fatalf("written %q", data)
	}
	// Replacing keeps the mode.
	if _, e := call(t, fs, "write_file", `{"path":"a.txt","content":"x\n"}`); e != nil {
		t.Fatal(e)
	}
	if fi, _ := os.Stat(filepath.Join(root, "a.txt")); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode after replace %v", fi.Mode())
	}
	if _, e := call(t, fs, "write_file", `{"path":"b64","content":"AAEC","encoding":"base64"}`); e != nil {
		t.Fatal(e)
	}
	if data, _ := os.ReadFile(filepath.Join(root, "b64")); string(data) != "\x00\x01\x02" {
		t.Fatalf("base64 write %q", data)
	}
	// edit_file rewrites in place: an open descriptor sees the new bytes.
	f, _ := os.Open(filepath.Join(root, "dir/b.go"))
	defer f.Close()
	if _, e := call(t, fs, "edit_file", `{"path":"dir/b.go","old_text":"TODO fix","new_text":"DONE"}`); e != nil {
		t.Fatal(e)
	}
	buf := make([]byte, 100)
	n, _ := f.ReadAt(buf, 0)
	if string(buf[:n]) != "package b\n// DONE\n" {
		t.Fatalf("open descriptor reads %q", buf[:n])
	}
	ents, _ := os.ReadDir(filepath.Join(root, "dir"))
	for _, e := range ents {
		if strings.Contains(e.Name(), "amlfs-tool") {
			t.Fatalf("temporary file left: %s", e.Name())
		}
	}
	m, e := call(t, fs, "delete", `{"path":"dir","recursive":true}`)
	if e != nil || m["removed"] != 4.0 {
		t.Fatalf("delete: %v %v", m, e)
	}
	if _, err := os.Stat(filepath.Join(root, "dir")); !os.IsNotExist(err) {
		t.Fatal("dir still there")
	}
	// A symlink is deleted, not followed.
	if _, e := call(t, fs, "delete", `{"path":"escape"}`); e != nil {
		t.Fatal(e)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(root), "secret")); err != nil {
		t.Fatal("deleting a symlink removed its target")
	}
}

func TestListStatMkdirGrep(t *testing.T) {
	fs, _ := setup(t)
	m, e := call(t, fs, "list_files", `{"path":"/","depth":0,"pattern":"**/*.go"}`)
	if e != nil {
		t.Fatal(e)
	}
	ents := m["entries"].([]any)
	if len(ents) != 2 || ents[0].(map[string]any)["path"] != "/dir/b.go" || ents[1].(map[string]any)["path"] != "/dir/sub/c.go" {
		t.Fatalf("list: %v", ents)
	}
	m, _ = call(t, fs, "list_files", `{"path":""}`)
	if n := len(m["entries"].([]any)); n != 6 {
		t.Fatalf("depth 1 lists %d entries, want 6: %v", n, m)
	}
	m, e = call(t, fs, "file_stat", `{"path":"escape"}`)
	if e != nil || m["type"] != "symlink" || m["target"] != "../secret" {
		t.Fatalf("stat of a symlink: %v %v", m, e)
	}
	m, e = call(t, fs, "mkdir", `{"path":"x/y/z"}`)
	if e != nil || m["created"] != true {
		t.Fatalf("mkdir: %v %v", m, e)
	}
	if m, e = call(t, fs, "mkdir", `{"path":"x/y/z"}`); e != nil || m["created"] != false {
		t.Fatalf("mkdir again: %v %v", m, e)
	}
	m, e = call(t, fs, "grep", `{"pattern":"TODO \\w+","glob":"**/*.go"}`)
	if e != nil {
		t.Fatal(e)
	}
	matches := m["matches"].([]any)
	if len(matches) != 2 || matches[0].(map[string]any)["line"] != 2.0 || matches[1].(map[string]any)["text"] != "// TODO later" {
		t.Fatalf("grep: %v", m)
	}
	m, _ = call(t, fs, "grep", `{"pattern":"TODO","max_results":1}`)
	if len(m["matches"].([]any)) != 1 || m["truncated"] != true {
		t.Fatalf("grep max_results: %v", m)
	}
}

func FuzzCall(f *testing.F) {
	for _, s := range []string{`{"path":"a.txt"}`, `{"path":"../x"}`, `{"pattern":"a+","path":"dir"}`, `{"path":"d","content":"x"}`, `[`, `{"path":null}`,
		`{"path":"/workspace/a.txt"}`, `{"path":"/workspace/../etc"}`, `{"path":"/a.txt"}`, `{"path":"fifo"}`, `{"path":"sock"}`, `{"pattern":"a","path":"/workspace"}`} {
		f.Add("read_file", s)
		f.Add("grep", s)
		f.Add("list_files", s)
	}
	f.Fuzz(func(t *testing.T, tool, args string) {
		root := t.TempDir()
		os.WriteFile(filepath.Join(root, "a.txt"), []byte("a\n"), 0o644)
		// A fifo and a socket: no call may hang on them.
		syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644)
		syscall.Mknod(filepath.Join(root, "sock"), syscall.S_IFSOCK|0o644, 0)
		fs := New(root, "/workspace")
		switch tool {
		case "read_file", "list_files", "file_stat", "grep":
		default:
			return // only tools that change nothing: the fuzzer must not fill the disk
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := fs.Call(ctx, tool, json.RawMessage(args))
		if ctx.Err() != nil {
			t.Fatalf("%s %s ran into its deadline", tool, args)
		}
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code == "" {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if _, err := json.Marshal(out); err != nil {
			t.Fatal(err)
		}
	})
}

// Paths are the sandbox's: absolute under the mount's sandbox path, or
// relative to the mount root; results are absolute; an absolute path
// elsewhere leaves the mount.
func TestSandboxPaths(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "report.md"), []byte("r\n"), 0o644)
	fs := New(root, "/workspace")
	for _, p := range []string{"/workspace/report.md", "report.md", "./report.md", "/workspace/./report.md"} {
		m, e := call(t, fs, "read_file", `{"path":"`+p+`"}`)
		if e != nil || m["path"] != "/workspace/report.md" {
			t.Errorf("read_file %s: %v %v", p, m, e)
		}
	}
	for _, p := range []string{"/report.md", "/workspacex/report.md", "/etc/passwd", "/"} {
		if _, e := call(t, fs, "read_file", `{"path":"`+p+`"}`); e == nil || e.Code != CodeEscape {
			t.Errorf("read_file %s: %v, want %s", p, e, CodeEscape)
		}
	}
	m, e := call(t, fs, "list_files", `{"path":"/workspace"}`)
	if e != nil || !strings.Contains(string(mustJSON(m)), "/workspace/report.md") {
		t.Errorf("list_files /workspace: %v %v", m, e)
	}
	// The root, named any way, is the mount's path as the sandbox sees it.
	for _, p := range []string{"/workspace", ".", ""} {
		if m, e := call(t, fs, "file_stat", `{"path":"`+p+`"}`); e != nil || m["path"] != "/workspace" || m["type"] != "directory" {
			t.Errorf("file_stat %q: %v %v", p, m, e)
		}
	}
}

func mustJSON(v any) []byte {
	data, _ := json.Marshal(v)
	return data
}

// A fifo never hangs a call: read_file and edit_file refuse it with
// NOT_A_REGULAR_FILE at once, and grep skips it, named or found.
func TestFifoNeverHangs(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "a.txt"), []byte("needle\n"), 0o644)
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	fs := New(root, "/")
	for _, c := range []struct{ tool, args, code string }{
		{"read_file", `{"path":"fifo"}`, CodeNotRegular},
		{"edit_file", `{"path":"fifo","old_text":"a","new_text":"b"}`, CodeNotRegular},
		{"grep", `{"pattern":"needle","path":"fifo"}`, CodeNotRegular},
		{"grep", `{"pattern":"needle"}`, ""},
	} {
		done := make(chan *Error, 1)
		go func() { _, e := call(t, fs, c.tool, c.args); done <- e }()
		select {
		case e := <-done:
			if (c.code == "" && e != nil) || (c.code != "" && (e == nil || e.Code != c.code)) {
				t.Errorf("%s %s: %v, want %q", c.tool, c.args, e, c.code)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s %s hangs on a fifo", c.tool, c.args)
		}
	}
}

// A line is matched on its first grepLineCap bytes: MaxGrepLine for a
// small pattern, fewer for one of many instructions, never under
// MinGrepLine. A match past the cap is not found.
func TestGrepLineCap(t *testing.T) {
	for _, c := range []struct {
		pattern string
		min     int
		max     int
	}{
		{"needle", MaxGrepLine, MaxGrepLine},
		{`foo.*bar`, MaxGrepLine, MaxGrepLine},
		{`(\w+\s*){200}z`, MinGrepLine, 8 << 10},
		{`(\w+\s*){1000}z`, MinGrepLine, MinGrepLine},
		{`(`, MinGrepLine, MinGrepLine},
	} {
		if got := grepLineCap(c.pattern); got < c.min || got > c.max {
			t.Errorf("grepLineCap(%q) = %d, want %d..%d", c.pattern, got, c.min, c.max)
		}
	}
	root, needle := t.TempDir(), "needle"
	os.WriteFile(filepath.Join(root, "long.txt"), []byte(strings.Repeat("x", MaxGrepLine)+"needle\nneedle\n"), 0o644)
	res, err := New(root, "/").Grep(context.Background(), GrepArgs{Pattern: &needle})
	if err != nil || len(res.Matches) != 1 || res.Matches[0].Line != 2 {
		t.Errorf("grep past the line cap: %+v %v, want line 2 only", res, err)
	}
}

// grep stops mid-file at its deadline, with TIMEOUT, and a single long line
// is matched on its first grepLineCap bytes only.
func TestGrepDeadline(t *testing.T) {
	root := t.TempDir()
	line := strings.Repeat("ab ", 333) + "\n"
	os.WriteFile(filepath.Join(root, "slow.txt"), []byte(strings.Repeat(line, 10000)), 0o644)
	os.WriteFile(filepath.Join(root, "one-line.txt"), []byte(strings.Repeat("ab ", 3<<20)), 0o644)
	fs := New(root, "/")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := fs.Call(ctx, "grep", json.RawMessage(`{"pattern":"(\\w+\\s*){200}z","path":"slow.txt"}`))
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeTimeout || time.Since(start) > 5*time.Second {
		t.Errorf("grep past its deadline: %v after %s", err, time.Since(start))
	}
	start = time.Now()
	if _, err := fs.Call(context.Background(), "grep", json.RawMessage(`{"pattern":"(\\w+\\s*){200}z","path":"one-line.txt"}`)); err != nil || time.Since(start) > 10*time.Second {
		t.Errorf("grep of one 9 MiB line: %v after %s", err, time.Since(start))
	}
}

// Every answer that can be cut says whether it was: truncated is always
// present.
func TestTruncatedAlwaysPresent(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "a.txt"), []byte("x\n"), 0o644)
	fs := New(root, "/")
	for _, c := range []struct{ tool, args string }{
		{"read_file", `{"path":"a.txt"}`}, {"list_files", `{"path":"."}`}, {"grep", `{"pattern":"x"}`},
	} {
		m, e := call(t, fs, c.tool, c.args)
		if e != nil {
			t.Fatal(e)
		}
		if v, ok := m["truncated"]; !ok || v != false {
			t.Errorf("%s: truncated = %v, %v", c.tool, v, ok)
		}
	}
}

// TestOwners: a rewrite keeps the file's owner, group and mode; a new
// file or directory takes its parent's owner, or the sandbox user's
// (issue 26, row 7: root's write_file made the user's own file root's).
func TestOwners(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to own files as others")
	}
	owner := func(p string) (uint32, uint32, os.FileMode) {
		t.Helper()
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		return st.Uid, st.Gid, fi.Mode().Perm()
	}
	for _, tc := range []struct {
		name     string
		sandbox  []int // SetOwner, if set
		uid, gid uint32
	}{
		{"parent's owner", nil, 4242, 4243},
		{"sandbox user", []int{5000, 5001}, 5000, 5001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			must(os.Chown(root, 4242, 4243))
			must(os.WriteFile(filepath.Join(root, "mine.txt"), []byte("mine"), 0o600))
			must(os.Chown(filepath.Join(root, "mine.txt"), 4343, 4344))
			fs := New(root, "/")
			if tc.sandbox != nil {
				fs.SetOwner(tc.sandbox[0], tc.sandbox[1])
			}
			if _, e := call(t, fs, "write_file", `{"path":"mine.txt","content":"rewritten"}`); e != nil {
				t.Fatal(e)
			}
			if u, g, m := owner(filepath.Join(root, "mine.txt")); u != 4343 || g != 4344 || m != 0o600 {
				t.Errorf("rewritten file: %d:%d %o, want 4343:4344 600", u, g, m)
			}
			if _, e := call(t, fs, "write_file", `{"path":"new/deep/file.txt","content":"x"}`); e != nil {
				t.Fatal(e)
			}
			for _, p := range []string{"new", "new/deep", "new/deep/file.txt"} {
				if u, g, _ := owner(filepath.Join(root, p)); u != tc.uid || g != tc.gid {
					t.Errorf("%s: %d:%d, want %d:%d", p, u, g, tc.uid, tc.gid)
				}
			}
			if _, e := call(t, fs, "mkdir", `{"path":"made"}`); e != nil {
				t.Fatal(e)
			}
			if u, g, m := owner(filepath.Join(root, "made")); u != tc.uid || g != tc.gid || m != 0o755 {
				t.Errorf("mkdir: %d:%d %o", u, g, m)
			}
		})
	}
}
