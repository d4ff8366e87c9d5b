package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/amlfs/amlfs/mount"
	"github.com/amlfs/amlfs/tools"
)

func toolClient(t *testing.T, e *env, mp string) *mount.Client {
	t.Helper()
	t.Setenv("AMLFS_RUNTIME_DIR", e.runtime)
	cl, err := mount.NewClient(mp)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// tool runs a call and decodes its result; a failed call fails the test.
func tool(t *testing.T, cl *mount.Client, name string, args any) map[string]any {
	t.Helper()
	m, err := toolErr(cl, name, args)
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return m
}

func toolErr(cl *mount.Client, name string, args any) (map[string]any, error) {
	data, _ := json.Marshal(args)
	out, err := cl.Tool(context.Background(), name, data)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// statSize is the size the kernel reports for p.
func statSize(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// Tool writes reach the shell at once, with the kernel's caches warm, and
// shell writes reach the tools; on the workspace and on a live mount.
func TestToolAndShellSeeOneTree(t *testing.T) {
	e := newEnv(t)
	host := t.TempDir()
	mp := e.mount("tools", "--mount", "/host=file://"+host, "--mount", "/ro=file://"+host+",ro")
	cl := toolClient(t, e, mp)
	for _, dir := range []string{"", "host"} {
		t.Run("dir="+dir, func(t *testing.T) {
			p := filepath.Join(mp, dir, "f.txt")
			rel := p // the shell's path: tool calls take it as is
			sh(t, mp, fmt.Sprintf("echo start > %s && cat %s >/dev/null && stat %s >/dev/null", p, p, p))
			for _, content := range []string{"grown to a much longer line than before\n", "short\n"} {
				tool(t, cl, "write_file", map[string]any{"path": rel, "content": content})
				if got := sh(t, mp, "cat "+p); got != content {
					t.Errorf("cat after write_file = %q, want %q", got, content)
				}
				if got := statSize(t, p); got != int64(len(content)) {
					t.Errorf("stat size after write_file = %d, want %d", got, len(content))
				}
			}
			// edit_file on a file a process holds open: its next read sees it.
			f, err := os.Open(p)
			must(t, err)
			defer f.Close()
			tool(t, cl, "edit_file", map[string]any{"path": rel, "old_text": "short", "new_text": "edited"})
			buf := make([]byte, 64)
			n, _ := f.ReadAt(buf, 0)
			if string(buf[:n]) != "edited\n" {
				t.Errorf("an open descriptor reads %q after edit_file", buf[:n])
			}
			// Shell write, tool read.
			sh(t, mp, "printf 'from the shell' > "+p)
			if m := tool(t, cl, "read_file", map[string]any{"path": rel}); m["content"] != "from the shell" {
				t.Errorf("read_file after a shell write = %v", m["content"])
			}
			tool(t, cl, "mkdir", map[string]any{"path": filepath.Join(dir, "d/e")})
			if fi, err := os.Stat(filepath.Join(mp, dir, "d/e")); err != nil || !fi.IsDir() {
				t.Errorf("mkdir: %v", err)
			}
			ls := sh(t, mp, "ls "+filepath.Join(mp, dir))
			tool(t, cl, "delete", map[string]any{"path": rel})
			if ls2 := sh(t, mp, "ls "+filepath.Join(mp, dir)); !strings.Contains(ls, "f.txt") || strings.Contains(ls2, "f.txt") {
				t.Errorf("ls before delete %q, after %q", ls, ls2)
			}
			if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("stat after delete: %v", err)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(host, "d/e")); err != nil {
		t.Errorf("the tool's mkdir did not reach the host directory: %v", err)
	}
	e.unmount(mp)
}

// Bad calls get a structured error and change nothing.
func TestToolBadCalls(t *testing.T) {
	e := newEnv(t)
	host := t.TempDir()
	os.WriteFile(filepath.Join(host, "h.txt"), []byte("host\n"), 0o644)
	mp := e.mount("badtools", "--mount", "/ro=file://"+host+",ro")
	sh(t, mp, "echo 'a a' > twice.txt && ln -s /etc out && ln -s ../.. up")
	cl := toolClient(t, e, mp)
	before := treeDigest(t, mp, nil)
	hostBefore := treeDigest(t, host, nil)
	for _, tc := range []struct {
		name, tool, args, code string
	}{
		{"dotdot", "read_file", `{"path":"../../etc/passwd"}`, tools.CodeEscape},
		{"symlink out", "write_file", `{"path":"out/x","content":"x"}`, tools.CodeEscape},
		{"symlink up", "list_files", `{"path":"up"}`, tools.CodeEscape},
		{"grep outside", "grep", `{"pattern":"root","path":"/out"}`, tools.CodeEscape},
		{"zero matches", "edit_file", `{"path":"twice.txt","old_text":"b","new_text":"c"}`, tools.CodeNoMatch},
		{"two matches", "edit_file", `{"path":"twice.txt","old_text":"a","new_text":"c"}`, tools.CodeManyMatch},
		{"write to ro", "write_file", `{"path":"ro/new.txt","content":"x"}`, "EROFS"},
		{"edit in ro", "edit_file", `{"path":"ro/h.txt","old_text":"host","new_text":"x"}`, "EROFS"},
		{"delete in ro", "delete", `{"path":"ro/h.txt"}`, "EROFS"},
		{"mkdir in ro", "mkdir", `{"path":"ro/d"}`, "EROFS"},
		{"malformed", "write_file", `{"path": "x", "content": `, tools.CodeInvalid},
		{"wrong type", "read_file", `{"path": 7}`, tools.CodeInvalid},
		{"unknown tool", "chmod", `{}`, tools.CodeUnknown},
	} {
		_, err := cl.Tool(context.Background(), tc.tool, json.RawMessage(tc.args))
		var te *tools.Error
		if !errors.As(err, &te) || te.Code != tc.code || te.Message == "" {
			t.Errorf("%s: %v, want a structured %s error", tc.name, err, tc.code)
		}
	}
	if after := treeDigest(t, mp, nil); !reflect.DeepEqual(before, after) {
		t.Errorf("bad calls changed the mount: %v", diffDigests(before, after))
	}
	if after := treeDigest(t, host, nil); !reflect.DeepEqual(hostBefore, after) {
		t.Errorf("bad calls changed the host directory: %v", diffDigests(hostBefore, after))
	}
	// The CLI prints the same structure and exits 1.
	r := e.amlfs("tool", mp, "read_file", `{"path":"../x"}`)
	if r.code != 1 || !strings.Contains(r.stdout, tools.CodeEscape) {
		t.Errorf("amlfs tool: %s", r)
	}
	e.unmount(mp)
}

// 8 tool clients and 8 shell writers on disjoint files: every file ends
// with the last content written to it, whole.
func TestToolConcurrency(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("concurrent")
	cl := toolClient(t, e, mp)
	dur := 30 * time.Second
	if testing.Short() {
		dur = 3 * time.Second
	}
	deadline := time.Now().Add(dur)
	body := func(name string, v int) string {
		// Sizes vary, so a torn or stale write shows as a wrong length.
		return fmt.Sprintf("%s version %d\n%s", name, v, strings.Repeat(fmt.Sprintf("%d", v%10), 100+(v*37)%5000))
	}
	var wg sync.WaitGroup
	last := make([]int, 16)
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("w%02d.txt", w)
			// Writers 0-7 are tool clients, 8-15 write through the mount.
			by, write := "write_file", func(v int) error {
				_, err := toolErr(cl, "write_file", map[string]any{"path": name, "content": body(name, v)})
				return err
			}
			if w >= 8 {
				by, write = "a shell write", func(v int) error {
					return os.WriteFile(filepath.Join(mp, name), []byte(body(name, v)), 0o644)
				}
			}
			for v := 1; time.Now().Before(deadline); v++ {
				err := write(v)
				if err == nil {
					last[w] = v
				}
				if err == nil && v%5 == 0 {
					var m map[string]any
					m, err = toolErr(cl, "read_file", map[string]any{"path": name})
					if err == nil && m["content"] != body(name, v) {
						err = fmt.Errorf("%s: read_file after %s %d returned other content", name, by, v)
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	total := 0
	for w := range 16 {
		name := fmt.Sprintf("w%02d.txt", w)
		got, err := os.ReadFile(filepath.Join(mp, name))
		if err != nil || string(got) != body(name, last[w]) {
			t.Errorf("%s: final content is not version %d (%d bytes, %v)", name, last[w], len(got), err)
		}
		total += last[w]
	}
	t.Logf("%d writes in %v", total, dur)
	if ents, _ := os.ReadDir(mp); len(ents) != 16 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		t.Errorf("the mount holds %d entries, want the 16 files: %v", len(ents), names)
	}
	e.unmount(mp)
}

// An MCP client session (go-sdk) lists the tools and runs each one.
func TestMCPServer(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("mcp")
	sh(t, mp, "mkdir -p src && printf 'package main\\n// TODO one\\n' > src/main.go")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sess := mcpSession(t, ctx, mp, append(os.Environ(), "AMLFS_RUNTIME_DIR="+e.runtime))
	list, err := sess.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range list.Tools {
		names = append(names, tl.Name)
		if tl.Description == "" || tl.InputSchema == nil {
			t.Errorf("%s has no description or schema", tl.Name)
		}
		a := tl.Annotations
		ro := tl.Name == "read_file" || tl.Name == "list_files" || tl.Name == "file_stat" || tl.Name == "grep"
		if a == nil || a.ReadOnlyHint != ro || a.DestructiveHint == nil || *a.DestructiveHint != (tl.Name == "write_file" || tl.Name == "edit_file" || tl.Name == "delete") {
			t.Errorf("%s annotations %+v", tl.Name, a)
		}
	}
	sort.Strings(names)
	if want := "delete edit_file file_stat grep list_files mkdir read_file write_file"; strings.Join(names, " ") != want {
		t.Errorf("tools %v, want %s", names, want)
	}
	call := func(name string, args map[string]any) (string, bool) {
		t.Helper()
		res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res.Content[0].(*mcp.TextContent).Text, res.IsError
	}
	for _, c := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"write_file", map[string]any{"path": filepath.Join(mp, "notes/a.md"), "content": "hello\n"}, `"size":6`},
		{"read_file", map[string]any{"path": "notes/a.md"}, `"content":"hello\n"`},
		{"edit_file", map[string]any{"path": "notes/a.md", "old_text": "hello", "new_text": "bye"}, `"size":4`},
		{"list_files", map[string]any{"path": mp, "depth": 0, "pattern": "**/*.md"}, `"` + filepath.Join(mp, "notes/a.md") + `"`},
		{"file_stat", map[string]any{"path": "src/main.go"}, `"type":"file"`},
		{"mkdir", map[string]any{"path": "x/y"}, `"created":true`},
		{"grep", map[string]any{"pattern": "TODO \\w+", "glob": "**/*.go"}, `"text":"// TODO one"`},
		{"delete", map[string]any{"path": "x", "recursive": true}, `"removed":2`},
	} {
		text, isErr := call(c.name, c.args)
		if isErr || !strings.Contains(text, c.want) {
			t.Errorf("%s: %s (error %v), want %s", c.name, text, isErr, c.want)
		}
	}
	if got := readFile(t, filepath.Join(mp, "notes/a.md")); got != "bye\n" {
		t.Errorf("the shell sees %q", got)
	}
	// A tool's failure is a result the model can read, not a protocol error.
	if text, isErr := call("read_file", map[string]any{"path": "../../etc/passwd"}); !isErr || !strings.Contains(text, tools.CodeEscape) {
		t.Errorf("escape through MCP: %s (error %v)", text, isErr)
	}
	sess.Close()
	e.unmount(mp)
}

// A write_file whose arguments are over the bound answers TOO_LARGE, not a
// JSON error, and writes nothing.
func TestToolWriteTooLarge(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("toolbig")
	cl := toolClient(t, e, mp)
	_, err := toolErr(cl, "write_file", map[string]any{"path": "big.bin", "content": strings.Repeat("x", tools.MaxArgsBytes+10)})
	if err == nil || !strings.Contains(err.Error(), tools.CodeTooLarge) {
		t.Errorf("write_file over the bound: %v", err)
	}
	if fileExists(filepath.Join(mp, "big.bin")) {
		t.Error("a refused write_file made the file")
	}
	// The CLI with the arguments on stdin: TOO_LARGE, not a cut JSON.
	cmd := exec.Command(amlfsBin, "tool", mp, "write_file")
	cmd.Env = append(os.Environ(), "AMLFS_RUNTIME_DIR="+e.runtime)
	cmd.Stdin = strings.NewReader(`{"path":"big.bin","content":"` + strings.Repeat("x", tools.MaxArgsBytes+10) + `"}`)
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), tools.CodeTooLarge) {
		t.Errorf("amlfs tool with %d bytes on stdin: %.300s", tools.MaxArgsBytes+10, out)
	}
	// MCP: a 16 MiB content (the SDK's own frame bound) is written; one
	// over the documented bound is TOO_LARGE; the server lives on.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sess := mcpSession(t, ctx, mp, append(os.Environ(), "AMLFS_RUNTIME_DIR="+e.runtime))
	for _, tc := range []struct {
		size   int
		tooBig bool
	}{{17 << 20, false}, {tools.MaxFrameBytes + 10, true}, {1 << 10, false}} {
		res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "write_file", Arguments: map[string]any{"path": "mcp.bin", "content": strings.Repeat("y", tc.size)}})
		if err != nil {
			t.Fatalf("MCP write_file of %d bytes: %v (the server died?)", tc.size, err)
		}
		text := ""
		if len(res.Content) > 0 {
			text = res.Content[0].(*mcp.TextContent).Text
		}
		if res.IsError != tc.tooBig || tc.tooBig && !strings.Contains(text, tools.CodeTooLarge) {
			t.Errorf("MCP write_file of %d bytes: error %v: %.200s", tc.size, res.IsError, text)
		}
		if fi, err := os.Stat(filepath.Join(mp, "mcp.bin")); !tc.tooBig && (err != nil || fi.Size() != int64(tc.size)) {
			t.Errorf("MCP write_file of %d bytes: %v %v", tc.size, fi, err)
		}
	}
	e.unmount(mp, "--no-save")
}

// On a mount where every path is read-only, MCP lists only the tools that
// change nothing.
func TestMCPReadOnlyMount(t *testing.T) {
	e := newEnv(t)
	host := t.TempDir()
	e.store = "none"
	mp := e.mount("mcp-ro", "--mount", "/ref=file://"+host+",ro")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sess := mcpSession(t, ctx, mp, append(os.Environ(), "AMLFS_RUNTIME_DIR="+e.runtime))
	list, err := sess.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range list.Tools {
		names = append(names, tl.Name)
	}
	sort.Strings(names)
	if want := "file_stat grep list_files read_file"; strings.Join(names, " ") != want {
		t.Errorf("tools on an all-read-only mount %v, want %s", names, want)
	}
}

// amlfs mcp finds its daemon from the mountpoint alone, in an empty
// environment (as the TypeScript SDK's StdioClientTransport starts it):
// the mount root names the control socket in a virtual xattr.
func TestMCPEmptyEnvironment(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("mcp-env")
	sh(t, mp, "echo hi > a.txt")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sess := mcpSession(t, ctx, mp, []string{})
	res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{"path": "a.txt"}})
	if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, `"content":"hi\n"`) {
		t.Fatalf("read_file through an MCP server with an empty environment: %v %+v", err, res)
	}
}

// A recursive delete that would stop half-way (at a live mount's root, or
// on a read-only mount) removes nothing; inside a read-write live mount it
// works.
func TestToolDeleteAllOrNothing(t *testing.T) {
	e := newEnv(t)
	host, host2, ro := t.TempDir(), t.TempDir(), t.TempDir()
	for _, d := range []string{host, host2, ro} {
		must(t, os.MkdirAll(filepath.Join(d, "sub"), 0o755))
		must(t, os.WriteFile(filepath.Join(d, "sub", "f"), []byte("x"), 0o644))
	}
	mp := e.mount("delete", "--mount", "/host=file://"+host, "--mount", "/outer/data=file://"+host2, "--mount", "/ro=file://"+ro+",ro")
	sh(t, mp, "echo keep > outer/keep.txt")
	cl := toolClient(t, e, mp)
	for _, c := range []struct{ path, code string }{
		{"host", "EBUSY"}, {"outer", "EBUSY"}, {"outer/data", "EBUSY"}, {"ro/sub", "EROFS"},
	} {
		_, err := toolErr(cl, "delete", map[string]any{"path": c.path, "recursive": true})
		if err == nil || !strings.Contains(err.Error(), c.code) {
			t.Errorf("delete %s: %v, want %s", c.path, err, c.code)
		}
	}
	for _, p := range []string{filepath.Join(host, "sub", "f"), filepath.Join(host2, "sub", "f"), filepath.Join(ro, "sub", "f"), filepath.Join(mp, "outer", "keep.txt")} {
		if !fileExists(p) {
			t.Errorf("a refused delete removed %s", p)
		}
	}
	if m := tool(t, cl, "delete", map[string]any{"path": "host/sub", "recursive": true}); m["removed"] != 2.0 || fileExists(filepath.Join(host, "sub")) {
		t.Errorf("delete inside a read-write live mount: %v", m)
	}
	e.unmount(mp, "--no-save")
}

// The official TypeScript SDK's client, with StdioClientTransport's default
// environment, lists the tools with their annotations and calls one.
func TestMCPTypeScriptClient(t *testing.T) {
	needTools(t, "nodejs npm", "node", "npm")
	node, err := exec.LookPath("node")
	must(t, err)
	// The SDK, installed once into the tool cache.
	home, _ := os.UserHomeDir()
	dir := filepath.Join(home, ".cache", "amlfs-tools", "mcp-ts")
	if !fileExists(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")) {
		must(t, os.MkdirAll(dir, 0o755))
		install := exec.Command("npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", dir, "@modelcontextprotocol/sdk@1")
		install.Env = append(os.Environ(), "AWS_CA_BUNDLE=")
		if out, err := install.CombinedOutput(); err != nil {
			t.Fatalf("npm install @modelcontextprotocol/sdk: %v\n%s", err, out)
		}
	}
	script, err := os.ReadFile(filepath.Join("testdata", "mcp-client.mjs"))
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, "client.mjs"), script, 0o644))
	e := newEnv(t)
	mp := e.mount("mcp-ts")
	sh(t, mp, "echo from-ts > a.txt")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "client.mjs"), amlfsBin, mp, filepath.Join(mp, "a.txt"))
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("the TypeScript client: %v\n%s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var got struct {
		Tools []struct {
			Name        string
			ReadOnly    bool
			Destructive bool
		}
		Read    string
		IsError bool
	}
	must(t, json.Unmarshal(out, &got))
	if len(got.Tools) != 8 || got.IsError || !strings.Contains(got.Read, `"content":"from-ts\n"`) {
		t.Errorf("the TypeScript client got %s", out)
	}
	for _, tl := range got.Tools {
		if tl.Name == "delete" && (!tl.Destructive || tl.ReadOnly) || tl.Name == "read_file" && !tl.ReadOnly {
			t.Errorf("annotations of %s: %+v", tl.Name, tl)
		}
	}
}

// mcpSession starts `amlfs mcp mp` with env and connects a go-sdk client
// to it, closed at the test's end.
func mcpSession(t *testing.T, ctx context.Context, mp string, env []string) *mcp.ClientSession {
	t.Helper()
	cmd := exec.Command(amlfsBin, "mcp", mp)
	cmd.Env = env
	sess, err := mcp.NewClient(&mcp.Implementation{Name: "amlfs-test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	return sess
}
