package fuse

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/mount/mountpoint"
)

// mountFD mounts a FUSE file system on the directory at (never on its
// path) with the new mount API: fsopen("fuse"), fsconfig, fsmount, then
// move_mount onto at's descriptor. It returns the /dev/fuse descriptor,
// which go-fuse then serves as the "magic" /dev/fd/N mountpoint, and the
// mount.
func mountFD(at *mountpoint.Dir, mo *fuse.MountOptions) (int, *mountpoint.Mount, error) {
	dev, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, &os.PathError{Op: "open", Path: "/dev/fuse", Err: err}
	}
	m, err := fsmountFUSE(at, mo, dev)
	if err != nil {
		unix.Close(dev)
		return -1, nil, err
	}
	return dev, m, nil
}

func fsmountFUSE(at *mountpoint.Dir, mo *fuse.MountOptions, dev int) (*mountpoint.Mount, error) {
	fsfd, err := unix.Fsopen("fuse", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, &os.PathError{Op: "fsopen", Path: "fuse", Err: err}
	}
	defer unix.Close(fsfd)
	source := mo.FsName
	if source == "" {
		source = mo.Name
	}
	attrs := unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
	params := [][2]string{
		{"source", source},
		{"subtype", mo.Name},
		{"fd", strconv.Itoa(dev)},
		{"rootmode", "40000"},
		{"user_id", strconv.Itoa(os.Geteuid())},
		{"group_id", strconv.Itoa(os.Getegid())},
		{"max_read", strconv.Itoa(mo.MaxWrite)},
	}
	if mo.AllowOther {
		params = append(params, [2]string{"allow_other"})
	}
	for _, o := range mo.Options {
		k, v, hasValue := strings.Cut(o, "=")
		switch k {
		case "ro":
			attrs |= unix.MOUNT_ATTR_RDONLY
		case "rw", "nonempty", "":
		case "noexec":
			attrs |= unix.MOUNT_ATTR_NOEXEC
		case "exec":
			attrs &^= unix.MOUNT_ATTR_NOEXEC
		case "suid":
			attrs &^= unix.MOUNT_ATTR_NOSUID
		case "nosuid":
			attrs |= unix.MOUNT_ATTR_NOSUID
		case "dev":
			attrs &^= unix.MOUNT_ATTR_NODEV
		case "nodev":
			attrs |= unix.MOUNT_ATTR_NODEV
		case "noatime":
			attrs |= unix.MOUNT_ATTR_NOATIME
		case "nodiratime":
			attrs |= unix.MOUNT_ATTR_NODIRATIME
		case "relatime":
			attrs |= unix.MOUNT_ATTR_RELATIME
		case "strictatime":
			attrs |= unix.MOUNT_ATTR_STRICTATIME
		default:
			if hasValue {
				params = append(params, [2]string{k, v})
			} else {
				params = append(params, [2]string{k})
			}
		}
	}
	for _, p := range params {
		if p[1] == "" && p[0] != "source" {
			err = unix.FsconfigSetFlag(fsfd, p[0])
		} else {
			err = unix.FsconfigSetString(fsfd, p[0], p[1])
		}
		if err != nil {
			return nil, fmt.Errorf("mount option %s: %w", strings.TrimSuffix(p[0]+"="+p[1], "="), err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, &os.PathError{Op: "fsconfig create", Path: at.Path(), Err: err}
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return nil, &os.PathError{Op: "fsmount", Path: at.Path(), Err: err}
	}
	return at.Attach(mfd)
}

// canMountFD reports whether the mount API may be used here: root with
// CAP_SYS_ADMIN. A daemon that is not root mounts through the setuid
// fusermount3, by path, as the user who runs it may.
func canMountFD() bool { return os.Geteuid() == 0 }

// isPerm reports a refusal for want of privilege (root in a container
// without CAP_SYS_ADMIN).
func isPerm(err error) bool { return errors.Is(err, unix.EPERM) }
