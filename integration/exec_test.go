package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// amlfs exec: mount, run, save per --save, unmount, exit with CMD's status.
func TestExec(t *testing.T) {
	e := newEnv(t)
	mp := filepath.Join(e.root, "mnt-exec")
	run := func(save string, script string) result {
		t.Helper()
		args := append([]string{"exec"}, e.wsArgs("ex", "--save", save)...)
		r := e.amlfs(append(args, mp, "--", "sh", "-c", script)...)
		if isMounted(mp) {
			e.forceUnmount(mp)
			t.Fatalf("still mounted after exec: %s", r)
		}
		return r
	}
	revisions := func() int { return len(readIndex(t, e, "ex").Revisions) }

	if r := run("on-success", "echo hi > a; exit 0"); r.code != 0 || !strings.Contains(r.stderr, "saved revision") {
		t.Fatalf("exit 0: %s", r)
	}
	cur := readIndex(t, e, "ex").Current
	// The saved revision has a: a fresh exec sees it.
	if r := run("never", `test "$(cat a)" = hi`); r.code != 0 {
		t.Fatalf("the saved revision lacks a: %s", r)
	}
	if r := run("on-success", "echo b > b; exit 7"); r.code != 7 || readIndex(t, e, "ex").Current != cur {
		t.Fatalf("exit 7 under on-success: %s (current %s, was %s)", r, readIndex(t, e, "ex").Current, cur)
	}
	if r := run("always", "echo c > c; exit 7"); r.code != 7 || readIndex(t, e, "ex").Current == cur {
		t.Fatalf("exit 7 under always saved nothing: %s", r)
	}
	if r := run("never", `test -f c && test ! -f b`); r.code != 0 {
		t.Fatalf("after always: c must be saved and b not: %s", r)
	}
	// A caller-chosen revision id.
	args := append([]string{"exec"}, e.wsArgs("ex", "--revision", "run-7")...)
	if r := e.amlfs(append(args, mp, "--", "sh", "-c", "echo r > r")...); r.code != 0 || readIndex(t, e, "ex").Current != "run-7" {
		t.Errorf("exec --revision run-7: %s", r)
	}
	// --cwd: relative to the mount root.
	if r := e.amlfs(append(append([]string{"exec"}, e.wsArgs("ex", "--save", "never", "--cwd", "d")...), mp, "--", "true")...); r.code != 2 {
		t.Errorf("--cwd of a missing directory: %s", r)
	}
	run("always", "mkdir -p d/e")
	if r := e.amlfs(append(append([]string{"exec"}, e.wsArgs("ex", "--save", "never", "--cwd", "/d/e")...), mp, "--", "sh", "-c", `test "$(pwd)" = "`+mp+`/d/e"`)...); r.code != 0 {
		t.Errorf("--cwd /d/e: %s", r)
	}
	// A failed save: exit 4, with the save's error and CMD's status.
	n := revisions()
	if r := run("on-success", `touch "$(printf 'bad\377')"`); r.code != 4 || !strings.Contains(r.stderr, "UNSUPPORTED_ENTRY") || !strings.Contains(r.stderr, "exited 0") {
		t.Errorf("failed save: %s", r)
	}
	if revisions() != n {
		t.Error("a failed save added a revision")
	}
}

// SIGTERM to amlfs exec is forwarded to CMD (and its children), skips the
// save, and leaves no mount.
func TestExecSignal(t *testing.T) {
	e := newEnv(t)
	mp := filepath.Join(e.root, "mnt-sig")
	args := append([]string{"exec"}, e.wsArgs("sig")...)
	cmd := exec.Command(amlfsBin, append(args, mp, "--", "sh", "-c", "echo x > a; touch started; sleep 60")...)
	cmd.Env = append(os.Environ(), "AMLFS_RUNTIME_DIR="+e.runtime)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	must(t, cmd.Start())
	t.Cleanup(func() { e.forceUnmount(mp) })
	waitFor(t, func() bool { return fileExists(filepath.Join(mp, "started")) })
	must(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("exec did not end after SIGTERM: %s", out.String())
	}
	if cmd.ProcessState.ExitCode() != 128+int(syscall.SIGTERM) {
		t.Errorf("exit %d, want %d: %s", cmd.ProcessState.ExitCode(), 128+int(syscall.SIGTERM), out.String())
	}
	if isMounted(mp) {
		t.Error("the mount is still there")
	}
	if fileExists(filepath.Join(e.storeD, "sig", "workspace.json")) {
		t.Errorf("a cancelled exec saved a revision: %s", out.String())
	}
}

// Under docker stop: a command that traps SIGTERM, finishes its work and
// exits 0 has succeeded, and its work is saved; one that ignores SIGTERM is
// killed after --stop-timeout, and its run is not saved.
func TestExecStop(t *testing.T) {
	e := newEnv(t)
	run := func(id, script string, extra ...string) (*exec.Cmd, *bytes.Buffer, string) {
		mp := filepath.Join(e.root, "mnt-"+id)
		args := append(append([]string{"exec"}, e.wsArgs(id, extra...)...), mp, "--", "sh", "-c", script)
		cmd := exec.Command(amlfsBin, args...)
		cmd.Env = append(os.Environ(), "AMLFS_RUNTIME_DIR="+e.runtime)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		must(t, cmd.Start())
		t.Cleanup(func() { e.forceUnmount(mp) })
		waitFor(t, func() bool { return fileExists(filepath.Join(mp, "started")) })
		must(t, cmd.Process.Signal(syscall.SIGTERM))
		return cmd, &out, mp
	}
	wait := func(cmd *exec.Cmd, out *bytes.Buffer, within time.Duration) {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(within):
			cmd.Process.Kill()
			t.Fatalf("exec did not end within %s: %s", within, out.String())
		}
	}
	// Traps SIGTERM, finishes, exits 0.
	cmd, out, _ := run("trap", `trap 'echo done > result; exit 0' TERM; touch started; while :; do sleep 0.1; done`)
	wait(cmd, out, 30*time.Second)
	if cmd.ProcessState.ExitCode() != 0 || !strings.Contains(out.String(), "saved revision") {
		t.Errorf("a command that finished after SIGTERM: exit %d: %s", cmd.ProcessState.ExitCode(), out.String())
	}
	h := e.host(t)
	m := h.mount("trap", "--no-lock", "--save", "never")
	if got := readFile(t, filepath.Join(m, "result")); got != "done\n" {
		t.Errorf("its work: %q", got)
	}
	h.unmount(m)
	// Ignores SIGTERM: killed after --stop-timeout.
	start := time.Now()
	cmd, out, _ = run("deaf", `trap '' TERM; touch started; while :; do sleep 0.1; done`, "--stop-timeout", "2s")
	wait(cmd, out, 30*time.Second)
	if cmd.ProcessState.ExitCode() != 128+int(syscall.SIGKILL) || time.Since(start) > 25*time.Second || !strings.Contains(out.String(), "--stop-timeout") {
		t.Errorf("a command deaf to SIGTERM: exit %d after %s: %s", cmd.ProcessState.ExitCode(), time.Since(start), out.String())
	}
}
