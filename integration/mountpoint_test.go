package integration

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amlfs/amlfs/mount"
)

// hostileUID is the sandbox user of the hostile-user tests: it owns the
// mountpoint's parent, as the agent user of /home/agent/workspace does.
const hostileUID = 4343

// asUser runs script with sh as hostileUID, in dir.
func asUser(t *testing.T, dir, script string) string {
	t.Helper()
	cmd := exec.Command("setpriv", "--reuid", fmt.Sprint(hostileUID), "--regid", fmt.Sprint(hostileUID), "--clear-groups", "sh", "-ec", script)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("as uid %d: %s\n%s: %v", hostileUID, script, out, err)
	}
	return string(out)
}

// agentHome makes e.root/home/agent, owned by hostileUID, traversable.
func agentHome(t *testing.T, e *env) string {
	t.Helper()
	e.traversable()
	home := filepath.Join(e.root, "home", "agent")
	must(t, os.MkdirAll(home, 0o755))
	must(t, os.Chown(home, hostileUID, hostileUID))
	return home
}

// TestMountpointHostile: a user who owns the mountpoint's parent plants
// a symlink, renames and swaps parents, and plants a discovery xattr. A
// root daemon and root's commands act only on the mount they were given,
// in both serving modes. Each step failed before the mountpoint was a
// handle (issue 26, rows 1 to 4).
func TestMountpointHostile(t *testing.T) {
	needTools(t, "util-linux", "setpriv")
	needTools(t, "python3", "python3")
	for _, serve := range []string{"fuse", "native"} {
		t.Run(serve, func(t *testing.T) {
			e := newEnv(t)
			if serve == "native" {
				needNative(t, e)
			}
			home := agentHome(t, e)
			rootOnly := filepath.Join(e.root, "root-only")
			must(t, os.MkdirAll(rootOnly, 0o700))
			must(t, os.WriteFile(filepath.Join(rootOnly, "secret"), []byte("root's secret"), 0o600))
			// A victim: another workspace, mounted by root elsewhere.
			victim := e.mount("victim", "--serve", serve)
			must(t, os.WriteFile(filepath.Join(victim, "unsaved"), []byte("the victim's unsaved work"), 0o644))

			// Row 1: a symlink at the mountpoint is never followed.
			asUser(t, home, "ln -s "+rootOnly+" workspace")
			for _, extra := range [][]string{nil, {"--allow-user-owned-parents"}} {
				r := e.amlfs(append([]string{"mount", "--daemon", filepath.Join(home, "workspace"), "--serve", serve}, e.wsArgs("w1", extra...)...)...)
				if r.code != 2 || !strings.Contains(r.stderr, "symbolic link") {
					t.Errorf("mount on a planted symlink %v: %s", extra, r)
				}
				if isMounted(rootOnly) {
					t.Fatalf("mounted over %s through the user's symlink", rootOnly)
				}
			}
			// A parent the user owns is refused unless allowed.
			asUser(t, home, "rm workspace && mkdir -p workspace p/ws")
			r := e.amlfs(append([]string{"mount", "--daemon", filepath.Join(home, "workspace"), "--serve", serve}, e.wsArgs("w1")...)...)
			if r.code != 2 || !strings.Contains(r.stderr, "--allow-user-owned-parents") || !strings.Contains(r.stderr, fmt.Sprintf("uid %d", hostileUID)) {
				t.Errorf("mount below a user's directory: %s", r)
			}
			// Allowed, it mounts; renaming its parent away and a symlink
			// in its place turn no tool call and no unmount elsewhere.
			mp := filepath.Join(home, "p", "ws")
			if r := e.mountAt(mp, "w1", "--serve", serve, "--allow-user-owned-parents"); r.code != 0 {
				t.Fatalf("mount with --allow-user-owned-parents: %s", r)
			}
			moved := filepath.Join(home, "p.old", "ws")
			t.Cleanup(func() { e.forceUnmount(moved) })
			must(t, os.WriteFile(filepath.Join(mp, "mine"), []byte("mine"), 0o644))
			asUser(t, home, "mv p p.old && mkdir evil && ln -s "+rootOnly+" evil/ws && ln -s evil p")
			if r := e.amlfs("tool", mp, "read_file", `{"path":"secret"}`); r.code == 0 || strings.Contains(r.stdout+r.stderr, "root's secret") {
				t.Errorf("read_file through a swapped parent: %s", r)
			}
			if r := e.amlfs("tool", mp, "write_file", `{"path":"planted","content":"x"}`); r.code == 0 {
				t.Errorf("write_file through a swapped parent: %s", r)
			}
			if _, err := os.Lstat(filepath.Join(rootOnly, "planted")); err == nil {
				t.Fatal("a tool call wrote into root's directory")
			}
			// The link pointed at the victim's mount: root's unmount of the
			// user's path must not reach the victim.
			asUser(t, home, "rm evil/ws && ln -s "+victim+" evil/ws")
			e.amlfs("unmount", "--no-save", mp)
			e.amlfs("status", mp)
			if !isMounted(victim) {
				t.Fatal("root's unmount of the user's path unmounted the victim")
			}
			// The daemon still serves its mount where the rename put it.
			if data, err := os.ReadFile(filepath.Join(moved, "mine")); err != nil || string(data) != "mine" {
				t.Errorf("the renamed mount: %q %v", data, err)
			}
			// Root reaches it where it is now, and the unmount saves it.
			if r := e.unmount(moved); r.code != 0 || isMounted(moved) {
				t.Errorf("unmount of the renamed mount where it is now: %s", r)
			}

			// Row 3: the discovery xattr on a plain directory.
			sock := filepath.Join(e.runtime, socketName(victim))
			if _, err := os.Stat(sock); err != nil {
				t.Fatalf("the victim's socket: %v", err)
			}
			asUser(t, home, fmt.Sprintf(`mkdir plain && python3 -c 'import os; os.setxattr("plain", "user.amlfs.control", b"%s")'`, sock))
			for _, cmd := range [][]string{{"unmount", "--no-save"}, {"status"}, {"commit"}} {
				r := e.amlfs(append(cmd, filepath.Join(home, "plain"))...)
				if strings.Contains(r.stdout, "victim") || r.code == 0 && cmd[0] != "unmount" {
					t.Errorf("%s of a directory naming the victim's socket: %s", cmd[0], r)
				}
			}
			if !isMounted(victim) {
				t.Fatal("a planted xattr turned root's unmount onto the victim")
			}
			// Row 4: the xattr on the user's own mount root, read by a
			// client with another runtime dir (an empty environment).
			if r := e.mountAt(filepath.Join(home, "own"), "w2", "--serve", serve, "--allow-user-owned-parents"); r.code != 0 {
				t.Fatalf("mount w2: %s", r)
			}
			must(t, os.Chown(filepath.Join(home, "own"), hostileUID, hostileUID))
			asUser(t, home, fmt.Sprintf(`python3 -c 'import os; os.setxattr("own", "user.amlfs.control", b"%s")' || true`, sock))
			other := *e
			other.runtime = t.TempDir()
			st := other.amlfs("status", "--json", filepath.Join(home, "own"))
			if strings.Contains(st.stdout, `"id": "victim"`) {
				t.Errorf("status of the user's mount answered for the victim: %s", st)
			}
			// Row 7: root's tool write over the user's own 0600 file
			// keeps it theirs; a new file takes its directory's owner.
			own := filepath.Join(home, "own")
			asUser(t, own, "echo mine > mine.txt && chmod 600 mine.txt")
			for _, call := range []string{`{"path":"mine.txt","content":"rewritten by a tool"}`, `{"path":"new.txt","content":"new"}`} {
				if r := e.amlfs("tool", own, "write_file", call); r.code != 0 {
					t.Fatalf("write_file %s: %s", call, r)
				}
			}
			if out := asUser(t, own, "cat mine.txt && stat -c '%u %a' mine.txt new.txt"); out != fmt.Sprintf("rewritten by a tool%[1]d 600\n%[1]d 644\n", hostileUID) {
				t.Errorf("the user's files after root's tool writes: %q", out)
			}
			// Row 9: a write lease the user holds, ignoring the kernel's
			// SIGIO, does not fail a save: the kernel breaks it.
			if serve == "native" {
				leaseBreak(t, "3")
				asUser(t, own, "echo leased > leased.txt")
				holder := exec.Command("setpriv", "--reuid", fmt.Sprint(hostileUID), "--regid", fmt.Sprint(hostileUID), "--clear-groups",
					"python3", "-c", `import fcntl, os, signal, sys, time
signal.signal(signal.SIGIO, signal.SIG_IGN)
fd = os.open("leased.txt", os.O_RDONLY)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
print("held", flush=True)
time.sleep(60)`)
				holder.Dir = own
				holder.Env = []string{"PATH=/usr/bin:/bin", "HOME=/"}
				stdout, err := holder.StdoutPipe()
				must(t, err)
				must(t, holder.Start())
				t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
				buf := make([]byte, 5)
				if n, _ := stdout.Read(buf); string(buf[:n]) != "held\n" {
					t.Fatalf("the lease holder: %q", buf[:n])
				}
				if r := e.amlfs("commit", own); r.code != 0 {
					t.Errorf("commit while the user holds a lease: %s", r)
				}
			}
			if data, err := os.ReadFile(filepath.Join(victim, "unsaved")); err != nil || !strings.Contains(string(data), "unsaved work") {
				t.Errorf("the victim's work: %q %v", data, err)
			}
		})
	}
}

// socketName is the control socket's name for mountpoint mp
// (mount.SocketPath without its directory).
func socketName(mp string) string {
	return filepath.Base(mount.SocketPath(mp))
}

// TestRefusedMountLeavesNothing: a mount refused for its configuration (a
// live mount whose directory is missing) takes no lease and leaves no
// tree that the next mount would resume as unsaved work and publish over
// another writer's revision (issue 26).
func TestRefusedMountLeavesNothing(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("refused")
	must(t, os.WriteFile(filepath.Join(mp, "a"), []byte("one"), 0o644))
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save: %s", r)
	}
	r := e.amlfs(append([]string{"mount", "--daemon", mp}, e.wsArgs("refused", "--mount", "/data=file://"+filepath.Join(e.root, "missing"))...)...)
	if r.code != 2 {
		t.Fatalf("mount with a live mount's directory missing: %s", r)
	}
	states, _ := filepath.Glob(filepath.Join(e.cache, "workspaces", "*", "*", "state.json"))
	if len(states) != 0 {
		t.Errorf("the refused mount left unsaved-work state: %v", states)
	}
	if _, err := os.Stat(filepath.Join(e.storeD, "refused.lock")); err == nil {
		t.Error("the refused mount left its lease")
	}
	// Another writer publishes; the next mount here takes its revision.
	h := e.host(t)
	mp2 := h.mount("refused")
	must(t, os.WriteFile(filepath.Join(mp2, "a"), []byte("two"), 0o644))
	if r := h.unmount(mp2); r.code != 0 {
		t.Fatalf("the other writer's save: %s", r)
	}
	r = e.mountAt(mp, "refused")
	if r.code != 0 || strings.Contains(r.stderr, "resuming") {
		t.Fatalf("the next mount: %s", r)
	}
	if data, err := os.ReadFile(filepath.Join(mp, "a")); err != nil || string(data) != "two" {
		t.Errorf("after the refused mount, the next one reads %q, %v; want the other writer's", data, err)
	}
}

// TestNoSaveUnmountWaitsForCommit: `unmount --no-save` while a commit is
// under way waits for it; nothing is published after the daemon said it
// stopped (issue 26).
func TestNoSaveUnmountWaitsForCommit(t *testing.T) {
	e, px := faultyS3Env(t)
	mp := e.mount("inflight")
	for i := 0; i < 20; i++ {
		must(t, os.WriteFile(filepath.Join(mp, fmt.Sprintf("f%d", i)), []byte("x"), 0o644))
	}
	px.set(&fault{kind: faultLatency, match: func(r *http.Request) bool { return r.Method == http.MethodPut }, delay: time.Second})
	commit := make(chan result, 1)
	var committedAt time.Time
	go func() { r := e.amlfs("commit", mp); committedAt = time.Now(); commit <- r }()
	time.Sleep(500 * time.Millisecond)
	r := e.unmount(mp, "--no-save")
	stoppedAt := time.Now()
	if r.code != 0 {
		t.Fatalf("unmount --no-save: %s", r)
	}
	c := <-commit
	px.set()
	if c.code == 0 {
		if committedAt.After(stoppedAt.Add(200 * time.Millisecond)) {
			t.Errorf("the commit published %v after the unmount --no-save answered that the daemon stopped", committedAt.Sub(stoppedAt))
		}
		rev := strings.TrimSpace(c.stdout)
		// The commit published before the unmount answered.
		list := e.amlfs(append([]string{"revisions", "list", "--json"}, e.storeFlags("inflight")...)...)
		if !strings.Contains(list.stdout, rev) {
			t.Errorf("the commit said %s, the store has %s", rev, list.stdout)
		}
	}
	before := e.amlfs(append([]string{"revisions", "list", "--json"}, e.storeFlags("inflight")...)...).stdout
	time.Sleep(2 * time.Second)
	after := e.amlfs(append([]string{"revisions", "list", "--json"}, e.storeFlags("inflight")...)...).stdout
	if before != after {
		t.Errorf("the store changed after the daemon stopped at %v:\n%s\n%s", stoppedAt, before, after)
	}
}

// TestLongIDOnS3: an id AML takes but too long for a cache directory's
// name mounts, saves and restores: its cache directory is named after
// its hash (issue 26: ids of 239 bytes or more could not be mounted).
func TestLongIDOnS3(t *testing.T) {
	e := newS3Env(t, startS3(t, false))
	// 241 bytes: over what a cache directory named id@store could take
	// (255), and under what versitygw's posix backend takes as one key
	// segment (real S3 takes 1,024 bytes a key).
	id := strings.Repeat("long-id-", 29) + "-final-id"
	mp := filepath.Join(e.root, "mnt-long")
	if r := e.mountAt(mp, id); r.code != 0 {
		t.Fatalf("mount an id of %d bytes: %s", len(id), r)
	}
	must(t, os.WriteFile(filepath.Join(mp, "f"), []byte("kept"), 0o644))
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save: %s", r)
	}
	h := e.host(t)
	if r := h.mountAt(mp, id); r.code != 0 {
		t.Fatalf("remount: %s", r)
	}
	if data, err := os.ReadFile(filepath.Join(mp, "f")); err != nil || string(data) != "kept" {
		t.Errorf("after the round trip: %q %v", data, err)
	}
	if st := h.amlfs("status", "--json", mp).stdout; !strings.Contains(st, id) {
		t.Errorf("status does not name the id: %s", st)
	}
}

// leaseBreak sets how long the kernel waits for a lease holder
// (/proc/sys/fs/lease-break-time) for the test.
func leaseBreak(t *testing.T, secs string) {
	t.Helper()
	const p = "/proc/sys/fs/lease-break-time"
	old, err := os.ReadFile(p)
	must(t, err)
	must(t, os.WriteFile(p, []byte(secs), 0o644))
	t.Cleanup(func() { os.WriteFile(p, old, 0o644) })
}
