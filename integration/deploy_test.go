package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dockerfile reads deploy/Dockerfile's final stage: its ENV settings, its
// ENTRYPOINT and its CMD.
func dockerfile(t *testing.T) (env []string, entrypoint, cmd []string) {
	t.Helper()
	data, err := os.ReadFile("../deploy/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		rest := strings.TrimSpace(strings.TrimPrefix(line, f[0]))
		switch f[0] {
		case "FROM":
			env = nil // only the final stage counts
		case "ENV":
			env = append(env, strings.Fields(rest)...)
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &entrypoint); err != nil {
				t.Fatalf("ENTRYPOINT is not exec form: %v", err)
			}
		case "CMD":
			if err := json.Unmarshal([]byte(rest), &cmd); err != nil {
				t.Fatalf("CMD is not exec form: %v", err)
			}
		}
	}
	return env, entrypoint, cmd
}

// TestDockerfileEntrypoint runs the example image's ENTRYPOINT, with its
// ENV, as `docker run IMAGE CMD...` would (no Docker daemon is needed):
// the command runs in the workspace, its work is saved when it exits 0,
// and SIGTERM (docker stop) ends it promptly with 128+15.
func TestDockerfileEntrypoint(t *testing.T) {
	env, entry, cmd := dockerfile(t)
	if len(entry) < 3 || entry[0] != "amlfs" || entry[1] != "exec" || entry[len(entry)-1] != "--" || len(cmd) == 0 {
		t.Fatalf("ENTRYPOINT %q, CMD %q: want amlfs exec ... -- and a default command", entry, cmd)
	}
	e := newEnv(t)
	mp := filepath.Join(e.root, "workspace")
	run := func(id string, command ...string) *exec.Cmd {
		args := append([]string{}, entry[1:]...)
		for i, a := range args {
			if a == "/workspace" {
				args[i] = mp // the image's mountpoint, here
			}
		}
		c := exec.Command(amlfsBin, append(args, command...)...)
		c.Env = append(append(os.Environ(), env...), "AMLFS_RUNTIME_DIR="+e.runtime,
			"AMLFS_STORE="+e.store, "AMLFS_ID="+id, "AMLFS_CACHE_DIR="+e.cache)
		return c
	}
	out, err := run("box", "sh", "-c", `pwd && echo from-the-container > out.txt`).CombinedOutput()
	if err != nil {
		t.Fatalf("entrypoint: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), mp) {
		t.Errorf("the command did not run in the workspace:\n%s", out)
	}
	if got := e.revisionFile(t, "box", "out.txt"); got != "from-the-container\n" {
		t.Fatalf("saved out.txt = %q", got)
	}
	// docker stop: SIGTERM, then SIGKILL after the grace period.
	c := run("box", "sleep", "300")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return isMounted(mp) })
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	c.Process.Signal(syscall.SIGTERM)
	err = c.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 128+15 {
		t.Fatalf("after SIGTERM: %v, want exit status 143", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("stopping took %s", took)
	}
	if isMounted(mp) {
		t.Error("still mounted")
	}
}

// TestSystemdUnit checks the example unit with systemd-analyze, then runs
// its ExecStart as systemd would and stops it with its KillSignal: the
// workspace is saved and the process gone inside TimeoutStopSec.
func TestSystemdUnit(t *testing.T) {
	data, err := os.ReadFile("../deploy/amlfs@.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := string(data)
	e := newEnv(t)
	mp := filepath.Join(e.root, "srv", "demo")
	conf := filepath.Join(e.root, "demo.yaml")
	os.WriteFile(conf, []byte("store: "+e.store+"\nid: demo\ncache-dir: "+e.cache+"\n"), 0o644)
	local := strings.NewReplacer("/usr/local/bin/amlfs", amlfsBin, "/srv/workspaces/%i", mp, "/etc/amlfs/%i.yaml", conf).Replace(unit)
	if sa, err := exec.LookPath("systemd-analyze"); err == nil {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "amlfs@.service"), []byte(local), 0o644)
		out, err := exec.Command(sa, "verify", "--man=no", filepath.Join(dir, "amlfs@demo.service")).CombinedOutput()
		if err != nil {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	} else {
		t.Log("no systemd-analyze; checking the unit's commands only")
	}
	get := func(key string) string {
		m := regexp.MustCompile(`(?m)^` + key + `=(.*)$`).FindStringSubmatch(local)
		if m == nil {
			t.Fatalf("the unit has no %s", key)
		}
		return strings.ReplaceAll(m[1], "%i", "demo")
	}
	if get("KillSignal") != "SIGTERM" {
		t.Fatalf("KillSignal=%s", get("KillSignal"))
	}
	grace, err := time.ParseDuration(get("TimeoutStopSec") + "s")
	if err != nil {
		t.Fatal(err)
	}
	argv := strings.Fields(get("ExecStart"))
	c := exec.Command(argv[0], argv[1:]...)
	c.Env = append(os.Environ(), "AMLFS_RUNTIME_DIR="+e.runtime)
	var stderr syncBuffer
	c.Stderr = &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); e.forceUnmount(mp) })
	waitFor(t, func() bool { return strings.Contains(stderr.String(), "mounted") })
	sh(t, mp, "echo unit > u.txt")
	start := time.Now()
	c.Process.Signal(syscall.SIGTERM)
	if err := c.Wait(); err != nil {
		t.Fatalf("stop: %v\n%s", err, stderr.String())
	}
	if took := time.Since(start); took > grace/2 {
		t.Errorf("stopping took %s of a %s grace period", took, grace)
	}
	if got := e.revisionFile(t, "demo", "u.txt"); got != "unit\n" {
		t.Fatalf("saved u.txt = %q", got)
	}
}
