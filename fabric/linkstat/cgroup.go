package linkstat

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// errNoCgroup2 says no cgroup v2 hierarchy is mounted (and none could be).
var errNoCgroup2 = errors.New("linkstat: no cgroup v2 hierarchy mounted")

// cgroup2Mount returns the mount point of the cgroup v2 hierarchy, from
// /proc/self/mountinfo: on hybrid systems it is often /sys/fs/cgroup/unified.
func cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts... - fstype source superopts
		line := sc.Text()
		sep := strings.Index(line, " - ")
		if sep < 0 {
			continue
		}
		post := strings.Fields(line[sep+3:])
		pre := strings.Fields(line[:sep])
		if len(post) > 0 && post[0] == "cgroup2" && len(pre) >= 5 {
			return pre[4], nil
		}
	}
	return "", errNoCgroup2
}

// mountCgroup2 mounts a cgroup v2 hierarchy at dir (for systems that mount
// only v1). It needs CAP_SYS_ADMIN.
func mountCgroup2(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("cgroup2", dir, "cgroup2", 0, ""); err != nil {
		return fmt.Errorf("mount cgroup2 at %s: %w", dir, err)
	}
	return nil
}

// selfCgroup2 returns this process's cgroup v2 directory: the "0::" line of
// /proc/self/cgroup under the v2 mount point.
func selfCgroup2(mount string) (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(mount, rest), nil
		}
	}
	return "", fmt.Errorf("linkstat: /proc/self/cgroup has no cgroup v2 entry")
}

// resolveCgroup finds the cgroup the program attaches to: the configured
// one, or this process's own v2 cgroup, mounting a v2 hierarchy at
// mountDir when none is mounted and mountDir is set.
func resolveCgroup(configured, mountDir string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	mount, err := cgroup2Mount()
	if errors.Is(err, errNoCgroup2) && mountDir != "" {
		if merr := mountCgroup2(mountDir); merr != nil {
			return "", fmt.Errorf("%w; %v", err, merr)
		}
		mount, err = mountDir, nil
	}
	if err != nil {
		return "", err
	}
	return selfCgroup2(mount)
}

// A sock_ops program attached to a cgroup runs for every TCP socket of
// every process in that cgroup and below it. Attached to a cgroup shared
// with other processes (the root cgroup, 0::/, above all) it would set
// callbacks on, and observe, their connections too. So the program goes
// only to a cgroup whose subtree holds this process alone: the configured
// one or this process's own if that is so, else a child cgroup made for
// this process (it moves there; a child stays under every limit of its
// parent), else nowhere, and the monitor polls TCP_INFO.

// errSharedCgroup says a cgroup holds other processes than this one.
var errSharedCgroup = errors.New("linkstat: cgroup holds other processes")

// sole is this process's own child cgroup, shared by every monitor of the
// process: the first one makes it and moves the process in, the last one to
// close moves the process back and removes it.
var sole struct {
	mu   sync.Mutex
	refs int
	dir  string // the child cgroup
	orig string // where the process was
}

// soleCgroup returns a cgroup v2 directory whose subtree holds this process
// alone, how it was found (for the log), and a release to call once the
// program is detached.
func soleCgroup(configured, mountDir string) (dir, how string, release func(), err error) {
	nop := func() {}
	if configured != "" {
		if err := alone(configured); err != nil {
			return "", "", nil, fmt.Errorf("configured cgroup %s: %w", configured, err)
		}
		return configured, "configured cgroup, which holds this process alone", nop, nil
	}
	sole.mu.Lock()
	defer sole.mu.Unlock()
	if sole.refs > 0 {
		sole.refs++
		return sole.dir, "child cgroup made for this process", releaseSole, nil
	}
	self, err := resolveCgroup("", mountDir)
	if err != nil {
		return "", "", nil, err
	}
	shared := alone(self)
	if shared == nil {
		return self, "this process's own cgroup, which holds it alone", nop, nil
	}
	child, err := moveToChild(self)
	if err != nil {
		return "", "", nil, fmt.Errorf("own cgroup %s: %w; and no child cgroup for this process: %v", self, shared, err)
	}
	sole.refs, sole.dir, sole.orig = 1, child, self
	return child, "child cgroup made for this process (its own cgroup " + self + " is shared)", releaseSole, nil
}

func releaseSole() {
	sole.mu.Lock()
	defer sole.mu.Unlock()
	if sole.refs--; sole.refs > 0 {
		return
	}
	// Back where it came from, so the child can go. A process that
	// cannot move back stays in its child, which costs nothing.
	pid := []byte(strconv.Itoa(os.Getpid()))
	if os.WriteFile(filepath.Join(sole.orig, "cgroup.procs"), pid, 0) == nil {
		os.Remove(sole.dir)
	}
	sole.dir, sole.orig = "", ""
}

// moveToChild makes the cgroup parent/tensorlane-<pid> and moves this
// process into it (all its threads: cgroup.procs), removing first the empty
// ones that processes now gone left behind.
func moveToChild(parent string) (string, error) {
	sweepChildren(parent)
	pid := os.Getpid()
	dir := filepath.Join(parent, "tensorlane-"+strconv.Itoa(pid))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		os.Remove(dir)
		return "", fmt.Errorf("move into %s: %w", dir, err)
	}
	if err := alone(dir); err != nil { // a pid reused, and its namesake's processes still there
		return "", err
	}
	return dir, nil
}

// sweepChildren removes the children tensorlane-<pid> of parent whose
// process is gone; rmdir fails, harmlessly, on one that is not empty.
func sweepChildren(parent string) {
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		n, ok := strings.CutPrefix(e.Name(), "tensorlane-")
		if !ok || !e.IsDir() {
			continue
		}
		pid, err := strconv.Atoi(n)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if unix.Kill(pid, 0) == unix.ESRCH {
			os.Remove(filepath.Join(parent, e.Name()))
		}
	}
}

// alone checks that the cgroup and every cgroup below it hold no process
// but this one (nor none at all: the program must be where the process is).
func alone(dir string) error {
	self := os.Getpid()
	found := false
	var others []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(string(b)) {
			if f == strconv.Itoa(self) {
				found = true
			} else if len(others) < 4 {
				others = append(others, f)
			}
		}
		if len(others) >= 4 {
			return filepath.SkipAll
		}
		return nil
	})
	switch {
	case err != nil:
		return err
	case len(others) > 0:
		return fmt.Errorf("%w (pids %s, perhaps more): its sock_ops program would hook their sockets", errSharedCgroup, strings.Join(others, " "))
	case !found:
		return fmt.Errorf("linkstat: this process is not in cgroup %s", dir)
	}
	return nil
}
