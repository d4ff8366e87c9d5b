package integration

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The attacker of the exchange race: an unprivileged user, on a mount a
// root daemon serves with allow_other, loops renameat2(RENAME_EXCHANGE)
// of its own directory d with a symlink s to a root-owned directory outside
// the mount, while it works on d/secret through the mount. A daemon that
// rebuilds paths from names and follows symlinks in the backing tree acts
// on the victim as root. The victim must come out byte-, mode- and
// owner-identical, and its directory unchanged.
const raceUID = 4242

// raceOps are the operations the attacker races, each as one try on
// d/secret, which it keeps as its own file.
var raceOps = map[string]func() error{
	"create": func() error {
		unix.Unlink("d/secret")
		return writeAt("d/secret", unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY)
	},
	"open-trunc": func() error {
		return writeAt("d/secret", unix.O_CREAT|unix.O_WRONLY|unix.O_TRUNC)
	},
	"chown": func() error {
		return unix.Fchownat(unix.AT_FDCWD, "d/secret", raceUID, raceUID, unix.AT_SYMLINK_NOFOLLOW)
	},
	"chmod":    func() error { return unix.Fchmodat(unix.AT_FDCWD, "d/secret", 0o666, 0) },
	"truncate": func() error { return unix.Truncate("d/secret", 1) },
	"utimens": func() error {
		return unix.UtimesNanoAt(unix.AT_FDCWD, "d/secret", []unix.Timespec{{Sec: 1}, {Sec: 1}}, unix.AT_SYMLINK_NOFOLLOW)
	},
	"setxattr":    func() error { return unix.Setxattr("d/secret", "user.pwn", []byte("x"), 0) },
	"removexattr": func() error { return unix.Removexattr("d/secret", "user.keep") },
	"unlink": func() error {
		writeAt("d/secret", unix.O_CREAT|unix.O_WRONLY)
		return unix.Unlink("d/secret")
	},
	"rename": func() error {
		writeAt("d/secret", unix.O_CREAT|unix.O_WRONLY)
		return unix.Rename("d/secret", "d/moved")
	},
	"rename-over": func() error {
		writeAt("d/new", unix.O_CREAT|unix.O_WRONLY)
		return unix.Rename("d/new", "d/secret")
	},
	"link": func() error {
		unix.Unlink("d/linked")
		return unix.Link("d/secret", "d/linked")
	},
	"mkdir-symlink-mknod": func() error {
		unix.Rmdir("d/sub")
		unix.Unlink("d/sym")
		unix.Unlink("d/fifo")
		unix.Mkdir("d/sub", 0o777)
		unix.Symlink("x", "d/sym")
		return unix.Mknod("d/fifo", unix.S_IFIFO|0o666, 0)
	},
	"read": func() error {
		fd, err := unix.Open("d/secret", unix.O_RDONLY, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		var b [64]byte
		n, err := unix.Read(fd, b[:])
		if n > 0 && strings.Contains(string(b[:n]), "root only") {
			fmt.Println("LEAK: read the victim")
		}
		return err
	},
}

func writeAt(name string, flags int) error {
	fd, err := unix.Open(name, flags, 0o644)
	if err != nil {
		return err
	}
	unix.Write(fd, []byte("pwned"))
	return unix.Close(fd)
}

// raceChild is the attacker's process, run as raceUID in the directory
// where its d and s are.
func raceChild(op string, n int) {
	var swaps atomic.Int64
	var swapErrs sync.Map
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, "d", unix.AT_FDCWD, "s", unix.RENAME_EXCHANGE); err != nil {
				swapErrs.Store(err.Error(), true)
			} else {
				swaps.Add(1)
			}
		}
	}()
	// Until n tries and n/10 exchanges, at most 10 tries to an exchange:
	// a try that fails in the kernel's walk through the symlink is much
	// quicker than an exchange, which would otherwise starve.
	var tries, ok int
	errs := map[string]int{}
	deadline := time.Now().Add(2 * time.Minute)
	for tries < n || swaps.Load() < int64(n/10) {
		for int64(tries) > 10*swaps.Load()+10 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Microsecond)
		}
		if time.Now().After(deadline) {
			fmt.Println("STUCK: the exchanges did not progress")
			break
		}
		tries++
		if err := raceOps[op](); err == nil {
			ok++
		} else {
			errs[err.Error()]++
		}
	}
	close(stop)
	wg.Wait()
	var se []string
	swapErrs.Range(func(k, _ any) bool { se = append(se, k.(string)); return true })
	fmt.Printf("%s: %d tries, %d reached d/secret; %d exchanges (errors %v); failures %v\n", op, tries, ok, swaps.Load(), se, errs)
}

// victimState is everything an attack could change about the victim.
func victimState(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	ents, err := os.ReadDir(dir)
	must(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	var st unix.Stat_t
	must(t, unix.Lstat(dir, &st))
	fmt.Fprintf(&b, "dir %v mode %o uid %d mtime %d.%d ctime %d.%d\n", names, st.Mode, st.Uid, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
	for _, name := range names {
		p := filepath.Join(dir, name)
		must(t, unix.Lstat(p, &st))
		f, err := os.Open(p)
		must(t, err)
		h := sha256.New()
		io.Copy(h, f)
		f.Close()
		xa := make([]byte, 1024)
		xn, _ := unix.Llistxattr(p, xa)
		fmt.Fprintf(&b, "%s ino %d mode %o uid %d gid %d nlink %d size %d mtime %d.%d ctime %d.%d xattrs %q sha %x\n",
			name, st.Ino, st.Mode, st.Uid, st.Gid, st.Nlink, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec, xa[:max(xn, 0)], h.Sum(nil))
	}
	return b.String()
}

// TestExchangeRaceStaysInside races every operation, 10,000 tries each,
// on the workspace and on a host-directory live mount.
func TestExchangeRaceStaysInside(t *testing.T) {
	needTools(t, "util-linux", "setpriv")
	tries := 10000
	if testing.Short() {
		tries = 1000
	}
	e := newEnv(t)
	bin := e.attackerBin()

	victim := filepath.Join(e.root, "victim")
	must(t, os.Mkdir(victim, 0o755))
	secret := filepath.Join(victim, "secret")
	must(t, os.WriteFile(secret, []byte("root only\n"), 0o600))
	must(t, unix.Setxattr(secret, "user.keep", []byte("1"), 0))
	must(t, os.WriteFile(filepath.Join(victim, "moved"), []byte("root's moved\n"), 0o600))
	before := victimState(t, victim)

	host := filepath.Join(e.root, "host")
	must(t, os.Mkdir(host, 0o777))
	must(t, os.Chmod(host, 0o777))
	// Through FUSE: the race is against the daemon's own path walks.
	mp := e.mount("race", "--serve", "fuse", "-o", "allow_other,default_permissions", "--mount", "/shared=file://"+host)
	must(t, os.Chmod(mp, 0o777))
	// The symlinks are not for saving (a revision holds no symlinks yet).
	must(t, os.WriteFile(filepath.Join(mp, ".gitignore"), []byte("race-*/\n"), 0o644))

	for _, where := range []string{"workspace", "shared"} {
		base := mp
		if where == "shared" {
			base = filepath.Join(mp, "shared")
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var report []string
		for op := range raceOps {
			if only := os.Getenv("AMLFS_RACE_OPS"); only != "" && !strings.Contains(","+only+",", ","+op+",") {
				continue
			}
			dir := filepath.Join(base, "race-"+op)
			must(t, os.Mkdir(dir, 0o755))
			must(t, os.Mkdir(filepath.Join(dir, "d"), 0o755))
			must(t, os.WriteFile(filepath.Join(dir, "d", "secret"), []byte("mine\n"), 0o644))
			must(t, unix.Setxattr(filepath.Join(dir, "d", "secret"), "user.keep", []byte("1"), 0))
			must(t, os.Symlink(victim, filepath.Join(dir, "s")))
			must(t, os.Lchown(dir, raceUID, raceUID))
			must(t, os.Lchown(filepath.Join(dir, "d"), raceUID, raceUID))
			must(t, os.Lchown(filepath.Join(dir, "d", "secret"), raceUID, raceUID))
			must(t, os.Lchown(filepath.Join(dir, "s"), raceUID, raceUID))
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmd := exec.Command("setpriv", fmt.Sprintf("--reuid=%d", raceUID), fmt.Sprintf("--regid=%d", raceUID), "--clear-groups", bin)
				cmd.Dir = dir
				cmd.Env = []string{"AMLFS_TEST_CHILD=race", "RACE_OP=" + op, "RACE_N=" + strconv.Itoa(tries), "PATH=" + os.Getenv("PATH")}
				out, err := cmd.CombinedOutput()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("%s %s: %v %s", where, op, err, out)
				}
				if strings.Contains(string(out), "LEAK") || strings.Contains(string(out), "STUCK") {
					t.Errorf("%s %s: %s", where, op, out)
				}
				report = append(report, strings.TrimSpace(string(out)))
			}()
		}
		wg.Wait()
		sort.Strings(report)
		t.Logf("%s:\n%s", where, strings.Join(report, "\n"))
		if after := victimState(t, victim); after != before {
			t.Fatalf("through the %s, the attacker changed the victim:\nbefore:\n%s\nafter:\n%s", where, before, after)
		}
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}
