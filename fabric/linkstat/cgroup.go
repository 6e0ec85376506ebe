package linkstat

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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
