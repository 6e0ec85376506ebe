// Package claims holds a process's claims on the devices of a (simulated or
// real) host: one lock file per (cluster, host, device) in a directory
// private to the user, held with flock(2) for the claiming runtime's life.
// The kernel drops a dead process's locks, so a crashed runtime never
// blocks its successor; runtimes of one process share its claims (rdt's
// tests and benchmarks simulate processes so). It also parses the device
// lists a scheduler hands a process (TENSORLANE_DEVICES,
// CUDA_VISIBLE_DEVICES). rdt's Config and Runtime are its callers
// (rdt/claims.go); rdt turns a HeldError into its DeviceClaimError.
package claims

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/internal/privdir"
	"github.com/tensorlane/tensorlane/tensor"
)

// HeldError: another live process holds the lock of Device.
type HeldError struct {
	Device tensor.DeviceID
	PID    int    // the holder's process ID as it wrote it; 0 if unknown
	Lock   string // the lock file
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%v is claimed by process %d (lock %s)", e.Device, e.PID, e.Lock)
}

// ProcessDir is a claims directory private to this process, for a program
// that simulates a whole cluster in one process: its runtimes claim
// nothing another process could want. It is removed when its last claim
// goes.
func ProcessDir() string {
	return filepath.Join(UserDir(nil), fmt.Sprintf("pid-%d", os.Getpid()))
}

// ParseCUDAVisible parses CUDA_VISIBLE_DEVICES. CUDA stops at the first
// invalid index and hides every device after it; "-1" and "" hide all.
func ParseCUDAVisible(s string) ([]int, error) {
	out := []int{}
	for f := range strings.SplitSeq(strings.TrimSpace(s), ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a device index (UUIDs and MIG names are not mapped)", f)
		}
		if n < 0 {
			break
		}
		out = append(out, n)
	}
	return out, nil
}

// DriverVisibleEnv are the variables a scheduler sets to hand a process
// its GPUs, in the order they are consulted when TENSORLANE_DEVICES is
// unset: CUDA's, then HIP's and ROCm's (AMD's runtime honours both).
var DriverVisibleEnv = []string{"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}

// DriverVisible returns the first of DriverVisibleEnv that is set, parsed
// like CUDA_VISIBLE_DEVICES.
func DriverVisible() (vis []int, name string, set bool, err error) {
	for _, name := range DriverVisibleEnv {
		if v, ok := os.LookupEnv(name); ok {
			vis, err := ParseCUDAVisible(v)
			return vis, name, true, err
		}
	}
	return nil, "", false, nil
}

// ParseVisible parses a TENSORLANE_DEVICES value; nil means all devices.
func ParseVisible(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	if s == "none" {
		return []int{}, nil
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a device index (want e.g. \"0,2\" or \"none\")", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// UserDir is this user's private directory for claims: the first of
// privdir.Candidates that is ours alone. One planted by another local user
// (a shared /tmp without XDG_RUNTIME_DIR: services, containers, Ray
// workers) is skipped and logged, never written through.
func UserDir(log *slog.Logger) string {
	dir, skipped, err := privdir.UserDir()
	if log != nil {
		for _, s := range skipped {
			log.Warn("rdt: skipped a claims directory that is not ours alone; another local user may have planted it", "err", s)
		}
	}
	if err != nil {
		// Nothing is private: Claim refuses the first candidate with
		// the reason, rather than claiming through it.
		return privdir.Candidates()[0]
	}
	return dir
}

// processClaims are the locks this process holds, shared by its runtimes.
var processClaims = struct {
	sync.Mutex
	m map[string]*claimLock
}{m: map[string]*claimLock{}}

type claimLock struct {
	f    *os.File
	refs int
}

// Claim locks every device of devs on host for this process (or
// shares the process's existing lock) and returns the function that drops
// them. On error nothing stays claimed; a device another process holds is a
// *HeldError.
func Claim(dir, cluster, host string, devs []tensor.DeviceID) (release func(), err error) {
	var paths []string
	release = func() {
		processClaims.Lock()
		defer processClaims.Unlock()
		for _, p := range paths {
			l := processClaims.m[p]
			if l.refs--; l.refs == 0 {
				// Unlink while locked, so a claimer that opened the old
				// file sees its inode is gone and retries (see lockFile).
				os.Remove(p)
				l.f.Close()
				delete(processClaims.m, p)
			}
		}
		paths = nil
		if dir == ProcessDir() {
			os.Remove(dir) // only this process uses it; fails while claims remain
		}
	}
	processClaims.Lock()
	defer processClaims.Unlock()
	// Under the lock: a release in this process may remove a private dir.
	if err := privdir.Ensure(dir); err != nil {
		return nil, fmt.Errorf("rdt: device claims: %w", err)
	}
	for _, d := range devs {
		if d.IsHost() {
			continue // host memory is everyone's
		}
		p := filepath.Join(dir, lockName(cluster, host, d))
		if l, ok := processClaims.m[p]; ok {
			l.refs++
			paths = append(paths, p)
			continue
		}
		f, pid, err := lockFile(p)
		if err != nil {
			processClaims.Unlock()
			release()
			processClaims.Lock()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, &HeldError{Device: d, PID: pid, Lock: p}
			}
			return nil, fmt.Errorf("rdt: claim %v on %s: %w", d, host, err)
		}
		processClaims.m[p] = &claimLock{f: f, refs: 1}
		paths = append(paths, p)
	}
	return release, nil
}

func lockName(cluster, host string, d tensor.DeviceID) string {
	clean := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r == '/' || r == 0 {
				return '_'
			}
			return r
		}, s)
	}
	return clean(cluster) + "." + clean(host) + "." + strings.ReplaceAll(d.String(), ":", "") + ".lock"
}

// lockFile takes an exclusive flock on path, creating it, and writes this
// process's pid into it. When another process holds it, the error is
// EWOULDBLOCK and pid is the holder's.
func lockFile(path string) (*os.File, int, error) {
	for range 8 { // retries only when a releaser unlinked the file under us
		// No links followed, nothing truncated that is not a lock of ours.
		f, err := privdir.OpenFile(path)
		if err != nil {
			return nil, 0, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			b := make([]byte, 32)
			n, _ := f.ReadAt(b, 0)
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b[:n])))
			f.Close()
			return nil, pid, err
		}
		var st1, st2 unix.Stat_t
		if unix.Fstat(int(f.Fd()), &st1) != nil || unix.Stat(path, &st2) != nil || st1.Ino != st2.Ino {
			f.Close()
			continue
		}
		f.Truncate(0)
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		return f, 0, nil
	}
	return nil, 0, fmt.Errorf("lock %s keeps being replaced", path)
}
