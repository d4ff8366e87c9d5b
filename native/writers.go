package native

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Writers. A natively served tree is written with no request the daemon
// sees, and a write through a shared mapping raises no event and, to a
// page already dirty, changes no stamp. So a save asks the kernel which
// files of the tree are open for writing or mapped shared and writable,
// by any process in any mount namespace: each descriptor's flags
// (/proc/PID/fdinfo) and each mapping (/proc/PID/maps). The page cache is
// the working tree's own, so a save reads what a mapping wrote.

// Writers returns the inode numbers of the files of the working tree's
// disk (the caller knows which are the tree's) that a process other than
// the daemon holds open for writing or mapped shared and writable now.
// It works after Close too: processes of other mount namespaces keep
// their copies of the mount.
func (s *Server) Writers() map[uint64]bool {
	out := map[uint64]bool{}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		s.log.Warn("list processes for the tree's writers", "op", "writers", "err", err)
		return out
	}
	self := os.Getpid()
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == self {
			continue
		}
		writingFds(pid, s.dev, out)
		sharedMaps(pid, s.dev, out)
	}
	return out
}

// writingFds adds the files of device dev that process pid has open for
// writing.
func writingFds(pid int, dev uint64, out map[uint64]bool) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return // gone, or a kernel thread
	}
	buf := make([]byte, 512)
	for _, fd := range fds {
		link := dir + "/" + fd.Name()
		n, err := unix.Readlink(link, buf)
		if err != nil || n == 0 || buf[0] != '/' {
			continue // a pipe, a socket, an anonymous inode
		}
		// The magic link reaches the very file, whatever its name now.
		var st unix.Stat_t
		if unix.Stat(link, &st) != nil || st.Dev != dev || st.Mode&unix.S_IFMT != unix.S_IFREG || out[st.Ino] {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		if err == nil && writableFlags(info) {
			out[st.Ino] = true
		}
	}
}

// writableFlags reads an fdinfo's flags: open for writing?
func writableFlags(info []byte) bool {
	for _, line := range bytes.Split(info, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("flags:")); ok {
			flags, err := strconv.ParseUint(strings.TrimSpace(string(v)), 8, 64)
			return err == nil && flags&unix.O_ACCMODE != unix.O_RDONLY
		}
	}
	return false
}

// sharedMaps adds the files of device dev that process pid maps shared
// and writable.
func sharedMaps(pid int, dev uint64, out map[uint64]bool) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if ino, ok := sharedWritable(sc.Text(), dev); ok {
			out[ino] = true
		}
	}
}

// sharedWritable parses one line of /proc/PID/maps ("start-end perms
// offset major:minor inode path"): the inode of a shared, writable
// mapping of a file of device dev.
func sharedWritable(line string, dev uint64) (uint64, bool) {
	f := strings.Fields(line)
	if len(f) < 5 || len(f[1]) != 4 || f[1][1] != 'w' || f[1][3] != 's' {
		return 0, false
	}
	maj, min, ok := strings.Cut(f[3], ":")
	if !ok {
		return 0, false
	}
	ma, err1 := strconv.ParseUint(maj, 16, 32)
	mi, err2 := strconv.ParseUint(min, 16, 32)
	ino, err3 := strconv.ParseUint(f[4], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || ino == 0 || unix.Mkdev(uint32(ma), uint32(mi)) != dev {
		return 0, false
	}
	return ino, true
}
