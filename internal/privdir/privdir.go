// Package privdir finds and opens the per-user directories where tensorlane
// keeps files other local users must never control: device claim locks and
// shared-memory sockets.
//
// A shared /tmp is hostile ground. Another local user can create
// /tmp/tensorlane-<uid> before we do, fill it with symbolic links, and wait
// for us to open "our" lock file through one of them. So a directory is used
// only when it is a real directory (not a link), owned by us and closed to
// everyone else, and files in it are opened without following links. When
// the usual place is taken by someone else, [UserDir] moves to the next
// candidate and says why, rather than failing (which would let any local
// user switch tensorlane off) or writing through it.
package privdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrNotPrivate reports a directory or file that is not ours alone: a link,
// not a directory, owned by another user. The error is a *Error.
var ErrNotPrivate = errors.New("privdir: not private")

// Error says which path was refused and why.
type Error struct {
	Path   string
	Reason string
}

func (e *Error) Error() string { return fmt.Sprintf("privdir: %s: %s", e.Path, e.Reason) }

func (e *Error) Unwrap() error { return ErrNotPrivate }

// Ensure creates dir (mode 0700) if it does not exist and checks that it is
// private: a real directory owned by the effective user. A directory of ours
// that is open to others (an old umask) is closed; anything else is refused
// with an error matching ErrNotPrivate.
func Ensure(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("privdir: %w", err)
		}
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("privdir: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		return &Error{dir, "is a symbolic link"}
	case !fi.IsDir():
		return &Error{dir, "is not a directory"}
	case !ok || int(st.Uid) != os.Geteuid():
		return &Error{dir, fmt.Sprintf("belongs to uid %d, not to us (uid %d)", st.Uid, os.Geteuid())}
	case fi.Mode().Perm()&0o077 != 0:
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("privdir: close %s to others: %w", dir, err)
		}
	}
	return nil
}

// Candidates lists, best first, where a user's tensorlane files may live:
// $XDG_RUNTIME_DIR/tensorlane (per user, on tmpfs, created by the login
// manager), <tmp>/tensorlane-<uid> (services, containers, cron and Ray
// workers have no XDG_RUNTIME_DIR), then a directory in the user's cache
// (owned by the user, so no one else can take it first).
func Candidates() []string {
	var out []string
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		out = append(out, filepath.Join(d, "tensorlane"))
	}
	out = append(out, filepath.Join(os.TempDir(), "tensorlane-"+strconv.Itoa(os.Geteuid())))
	if d, err := os.UserCacheDir(); err == nil {
		out = append(out, filepath.Join(d, "tensorlane", "run"))
	}
	return out
}

// UserDir returns the first candidate directory that is (or can be made)
// private, and the refusals of those it skipped, so the caller can log them:
// a skipped directory usually means another local user planted it. Every
// process of a user with the same environment picks the same one, which is
// what device claims need.
func UserDir() (dir string, skipped []error, err error) {
	for _, c := range Candidates() {
		if err := Ensure(c); err != nil {
			skipped = append(skipped, err)
			continue
		}
		return c, skipped, nil
	}
	return "", skipped, fmt.Errorf("privdir: no private directory for tensorlane's files: %w", errors.Join(skipped...))
}

// OpenFile opens (creating with mode 0600) a file in a private directory
// without following a symbolic link at its last component, and checks that
// it is a regular file owned by us with no other name: a planted link or
// hard link is refused with ErrNotPrivate and nothing is written through it.
func OpenFile(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, &Error{path, "is a symbolic link"}
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	reason := ""
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		reason = "is not a regular file"
	case int(st.Uid) != os.Geteuid():
		reason = fmt.Sprintf("belongs to uid %d, not to us", st.Uid)
	case st.Nlink > 1:
		reason = fmt.Sprintf("has %d names (a hard link)", st.Nlink)
	}
	if reason != "" {
		unix.Close(fd)
		return nil, &Error{path, reason}
	}
	// Back to blocking mode: O_NONBLOCK was only there so a planted FIFO
	// could not hang the open.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fcntl", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}
