package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// socketChild runs as another user: it connects to the socket path in
// $SOCK_PATH as fast as it can until $SOCK_STOP exists, and reports every
// connection it got.
func socketChild() {
	path, stop := os.Getenv("SOCK_PATH"), os.Getenv("SOCK_STOP")
	tries, got := 0, 0
	var errs = map[string]int{}
	for {
		if tries%256 == 0 {
			if _, err := os.Stat(stop); err == nil {
				break
			}
		}
		tries++
		c, err := net.Dial("unix", path)
		if err == nil {
			got++
			c.Close()
			continue
		}
		msg := err.Error()
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			msg = msg[i+2:]
		}
		errs[msg]++
	}
	if got > 0 {
		fmt.Printf("LEAK: %d of %d connections to %s succeeded\n", got, tries, path)
	}
	fmt.Printf("%d tries; errors %v\n", tries, errs)
}

// TestControlSocketNoWindow: another local user who loops on connect(2)
// to a daemon's control socket, while the daemon starts again and again,
// never gets a connection (the socket accepts any tool call as root). A
// root helper keeps the runtime dir traversable throughout, as an admin
// might, so the socket's own mode is the only guard: it must be 0600 from
// its first instant (bound under umask 077), with no window before a
// chmod. Run with the bind outside that umask, the child connects.
func TestControlSocketNoWindow(t *testing.T) {
	needTools(t, "util-linux", "setpriv")
	e := newEnv(t)
	bin := e.attackerBin()
	must(t, os.MkdirAll(e.runtime, 0o755))
	// The daemon's socket path: the only .sock its first mount makes.
	mp := e.mount("sock")
	var sock string
	ents, err := os.ReadDir(e.runtime)
	must(t, err)
	for _, de := range ents {
		if strings.HasSuffix(de.Name(), ".sock") {
			sock = filepath.Join(e.runtime, de.Name())
		}
	}
	if sock == "" {
		t.Fatalf("no socket in %s", e.runtime)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}

	stop := filepath.Join(e.root, "stop")
	var done atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the admin: the runtime dir stays traversable
		defer wg.Done()
		for !done.Load() {
			os.Chmod(e.runtime, 0o755)
			time.Sleep(50 * time.Microsecond)
		}
	}()
	cmd := exec.Command("setpriv", fmt.Sprintf("--reuid=%d", raceUID), fmt.Sprintf("--regid=%d", raceUID), "--clear-groups", bin)
	cmd.Env = []string{"AMLFS_TEST_CHILD=socket", "SOCK_PATH=" + sock, "SOCK_STOP=" + stop}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	must(t, cmd.Start())
	cycles := 10
	if testing.Short() {
		cycles = 5
	}
	for range cycles {
		if r := e.mountAt(mp, "sock"); r.code != 0 {
			t.Fatalf("mount: %s", r)
		}
		if r := e.unmount(mp); r.code != 0 {
			t.Fatalf("unmount: %s", r)
		}
	}
	must(t, os.WriteFile(stop, nil, 0o644))
	err = cmd.Wait()
	done.Store(true)
	wg.Wait()
	t.Logf("attacker: %s", strings.TrimSpace(out.String()))
	if err != nil || strings.Contains(out.String(), "LEAK") || !strings.Contains(out.String(), "tries") {
		t.Fatalf("uid %d connected to the control socket (or did not run): %v\n%s", raceUID, err, out.String())
	}
}
