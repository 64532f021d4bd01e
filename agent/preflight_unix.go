//go:build unix

package agent

import "golang.org/x/sys/unix"

// The limits a pre-flight reads (rlimit).
const (
	rlimitMemlock = unix.RLIMIT_MEMLOCK
	rlimitNofile  = unix.RLIMIT_NOFILE
)

// rlimit returns the soft and hard limits of resource; -1 is unlimited.
func rlimit(resource int) (cur, max int64, err error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(resource, &rl); err != nil {
		return 0, 0, err
	}
	conv := func(v uint64) int64 {
		if v == unix.RLIM_INFINITY || v > 1<<62 {
			return -1
		}
		return int64(v)
	}
	return conv(rl.Cur), conv(rl.Max), nil
}

// diskSpace returns the size of the file system that holds path and the
// bytes free there for an unprivileged user.
func diskSpace(path string) (size, free int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, err
	}
	bs := int64(st.Bsize)
	return int64(st.Blocks) * bs, int64(st.Bavail) * bs, nil
}
