package tools

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	return New(root), root
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
	for _, s := range []string{`{"path":"a.txt"}`, `{"path":"../x"}`, `{"pattern":"a+","path":"dir"}`, `{"path":"d","content":"x"}`, `[`, `{"path":null}`} {
		f.Add("read_file", s)
		f.Add("grep", s)
		f.Add("list_files", s)
	}
	f.Fuzz(func(t *testing.T, tool, args string) {
		root := t.TempDir()
		os.WriteFile(filepath.Join(root, "a.txt"), []byte("a\n"), 0o644)
		fs := New(filepath.Join(root))
		switch tool {
		case "read_file", "list_files", "file_stat", "grep":
		default:
			return // only tools that change nothing: the fuzzer must not fill the disk
		}
		out, err := fs.Call(context.Background(), tool, json.RawMessage(args))
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
