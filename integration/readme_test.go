package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeQuickStart runs every command of the README's quick start (but
// the test commands, one of which is what runs this; .ci/run runs them all), as one shell script, with
// the machine-wide paths swapped for temporary ones: the binary, the
// mountpoint and the store; the S3 part runs against versitygw.
func TestReadmeQuickStart(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, "## Quick start")
	end := strings.Index(text[start+1:], "\n## ") + start + 1
	if start < 0 || end <= start {
		t.Fatal("no Quick start section")
	}
	var lines []string
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(text[start:end], -1) {
		for _, line := range strings.Split(block[1], "\n") {
			if strings.TrimSpace(line) == "" || strings.Contains(line, "go test ") || strings.Contains(line, "npm test") {
				continue
			}
			lines = append(lines, line)
		}
	}
	if len(lines) < 10 {
		t.Fatalf("only %d commands in the quick start", len(lines))
	}
	srv := startS3(t, false)
	if err := os.MkdirAll(filepath.Join(srv.data, "my-bucket"), 0o755); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	bin := filepath.Join(e.root, "bin")
	mp := filepath.Join(e.root, "workspace")
	script := strings.Join(lines, "\n")
	script = strings.ReplaceAll(script, "/usr/local/bin/amlfs", filepath.Join(bin, "amlfs"))
	script = regexp.MustCompile(`/workspace\b`).ReplaceAllString(script, mp)
	script = strings.ReplaceAll(script, "file:///var/lib/amlfs", "file://"+e.storeD)
	script = strings.ReplaceAll(script, "http://127.0.0.1:7070", srv.endpoint)
	t.Cleanup(func() { e.forceUnmount(mp) })
	cmd := exec.Command("sh", "-ec", "set -x\n"+script)
	cmd.Dir = ".."
	// A fresh HOME, but the Go build and module caches of this run: with
	// HOME's own, the install compiled every dependency from nothing
	// (100 s of the suite), which tests Go, not the quick start.
	goEnv, err := exec.Command("go", "env", "GOCACHE", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	caches := strings.Fields(string(goEnv))
	cmd.Env = append(append(os.Environ(), s3Env()...), "PATH="+bin+":"+os.Getenv("PATH"), "AMLFS_RUNTIME_DIR="+e.runtime,
		"XDG_CACHE_HOME="+filepath.Join(e.root, "xdg"), "HOME="+e.root, "GOCACHE="+caches[0], "GOMODCACHE="+caches[1])
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the quick start failed: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "hello") {
		t.Errorf("notes.md did not come back:\n%s", out)
	}
	if isMounted(mp) {
		t.Error("the quick start leaves the workspace mounted")
	}
}
