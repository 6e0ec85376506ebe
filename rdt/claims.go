package rdt

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/internal/privdir"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/tensor"
)

// Device claims. Several processes may share a host, each with some of its
// devices (the way a scheduler hands out CUDA_VISIBLE_DEVICES): a runtime
// claims the devices it serves with one lock file per (cluster, host,
// device) under Config.RuntimeDir, held with flock(2) for its life. The
// kernel drops a dead process's locks, so a crashed runtime never blocks
// its successor. Runtimes of one process share its claims: several
// runtimes claiming one host in one process is how tests and benchmarks
// simulate processes, and they know what they are doing.

// EnvDevices narrows the accelerators a runtime claims, like
// CUDA_VISIBLE_DEVICES: "0,2" (indices of the host's accelerators), or
// "none" (host memory only). Honoured unless Config.IgnoreEnv is set.
const EnvDevices = "TENSORLANE_DEVICES"

// EnvRuntimeDir overrides the directory of device claim locks (default
// $XDG_RUNTIME_DIR/tensorlane, else <tmp>/tensorlane-<uid>, else, when another
// user holds that one, <user cache>/tensorlane/run). Honoured unless
// Config.IgnoreEnv is set.
const EnvRuntimeDir = "TENSORLANE_RUNTIME_DIR"

// ErrDeviceClaimed: another live process's runtime claims a device this
// runtime asked for. The error is a *DeviceClaimError.
var ErrDeviceClaimed = errs.DeviceClaimed

// DeviceClaimError says which device is taken and by whom.
type DeviceClaimError struct {
	Host   string
	Device tensor.DeviceID
	PID    int    // the holder's process ID as it wrote it; 0 if unknown
	Lock   string // the lock file
}

func (e *DeviceClaimError) Error() string {
	who := "another process"
	if e.PID > 0 {
		who = "process " + strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("rdt: %v on host %s is claimed by %s (lock %s); give each process its own devices with Config.VisibleDevices or %s",
		e.Device, e.Host, who, e.Lock, EnvDevices)
}

func (e *DeviceClaimError) Unwrap() error { return ErrDeviceClaimed }

// EnvCUDAVisible is read when EnvDevices is not set: the accelerators a
// scheduler gave this process, as host indices ("0,2"; "" or "-1": none).
// Device UUIDs and MIG names are refused with a clear error, since the
// simulated and discovered topologies number devices by index.
const EnvCUDAVisible = "CUDA_VISIBLE_DEVICES"

// parseCUDAVisible parses CUDA_VISIBLE_DEVICES. CUDA stops at the first
// invalid index and hides every device after it; "-1" and "" hide all.
func parseCUDAVisible(s string) ([]int, error) {
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

// parseVisible parses a TENSORLANE_DEVICES value; nil means all devices.
func parseVisible(s string) ([]int, error) {
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

// ProcessRuntimeDir is a claims directory private to this process, for a
// program that simulates a whole cluster in one process (a demo, a
// benchmark): its runtimes claim nothing another process could want, and
// two such programs on one machine must not refuse each other. Set it as
// Config.RuntimeDir. It is removed when its last claim goes.
func ProcessRuntimeDir() string {
	return filepath.Join(userRuntimeDir(nil), fmt.Sprintf("pid-%d", os.Getpid()))
}

// userRuntimeDir is this user's private directory for claims: the first of
// privdir.Candidates that is ours alone. One planted by another local user
// (a shared /tmp without XDG_RUNTIME_DIR: services, containers, Ray
// workers) is skipped and logged, never written through.
func userRuntimeDir(log *slog.Logger) string {
	dir, skipped, err := privdir.UserDir()
	if log != nil {
		for _, s := range skipped {
			log.Warn("rdt: skipped a claims directory that is not ours alone; another local user may have planted it", "err", s)
		}
	}
	if err != nil {
		// Nothing is private: claimDevices refuses the first candidate with
		// the reason, rather than claiming through it.
		return privdir.Candidates()[0]
	}
	return dir
}

// defaultRuntimeDir is where claims live when neither Config nor the
// environment says. A test binary gets a directory of its own: go test runs
// packages in parallel processes that simulate the same hosts, and they
// must not refuse each other (tests of the guard set RuntimeDir).
func defaultRuntimeDir(log *slog.Logger) string {
	if testing.Testing() {
		return ProcessRuntimeDir()
	}
	return userRuntimeDir(log)
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

// claimDevices locks every device of devs on host for this process (or
// shares the process's existing lock) and returns the function that drops
// them. On error nothing stays claimed.
func claimDevices(dir, cluster, host string, devs []tensor.DeviceID) (release func(), err error) {
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
		if dir == ProcessRuntimeDir() {
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
				return nil, &DeviceClaimError{Host: host, Device: d, PID: pid, Lock: p}
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
