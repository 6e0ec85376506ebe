// Package devbench measures tensorlane's paths between CUDA device memory
// against the device's own yardsticks, in the same run, interleaved
// (base, path, base, path ...): a device-to-device Get on one GPU against
// cuMemcpyDtoD, a Get from another process by the allocation's handle
// (VMM fd and legacy IPC) against cuMemcpyDtoD, and device → tcp → device
// over loopback against raw TCP of host memory. `tensorlane bench --paths
// device` prints its rows, and scripts/gpu-check.sh's Go half prints
// them on a GPU. On the fake CUDA driver (tensor/cuda/cudatest) the rows
// run as well, marked mode "fake-driver": its copies are memcpy, so the
// figures say the code runs, nothing about speed.
package devbench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/local"
	"github.com/tensorlane/tensorlane/fabric/shm"
	"github.com/tensorlane/tensorlane/fabric/tcp"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/cuda"
)

// The rows, by path name.
const (
	PathD2D       = "cuda-d2d"        // in-process p2p Get, one GPU
	PathIPCVMM    = "cuda-ipc-vmm"    // Get from another process, VMM fd
	PathIPCLegacy = "cuda-ipc-legacy" // Get from another process, cuIpc handle
	PathTCP       = "cuda-tcp"        // device → tcp → device on loopback

	BaseDtoD   = "cuMemcpyDtoD"
	BaseRawTCP = "tcp-raw" // bench/harness's name for the same baseline

	ModeGPU  = "gpu"
	ModeFake = "fake-driver"
)

// Goals are issue 25's ratios per path, on a GPU at 64 MiB and up (the
// fake driver's rows have none).
var Goals = map[string]float64{PathD2D: 0.9, PathIPCVMM: 0.8, PathIPCLegacy: 0.8, PathTCP: 0.7}

// GoalMinSize is the least size a goal applies at (bandwidth-bound).
const GoalMinSize = 64 << 20

// Row is one measured (or skipped) path. The package stays apart from
// bench/harness (which links the whole runtime) so that the GPU check's
// test binary, carried to a GPU machine, stays small; the command turns
// rows into harness records.
type Row struct {
	Path, Mode, Baseline string
	Size                 int64
	GBps, BaselineGBps   float64 // medians
	Ratio                float64 // median of the rounds' baseline time / path time
	Rounds               int
	Skipped              string // why the row did not run; empty when measured
	Note                 string
}

// Goal returns the row's goal and whether one applies.
func (r Row) Goal() (float64, bool) {
	g, ok := Goals[r.Path]
	return g, ok && r.Mode == ModeGPU && r.Skipped == "" && r.Size >= GoalMinSize
}

// String is the row as the GPU check prints it.
func (r Row) String() string {
	if r.Skipped != "" {
		return fmt.Sprintf("%-16s %s: skipped: %s", r.Path, sizeString(r.Size), r.Skipped)
	}
	line := fmt.Sprintf("%-16s %-11s %6s: %8.2f GB/s, %s %8.2f GB/s, ratio %.2f", r.Path, r.Mode, sizeString(r.Size), r.GBps, r.Baseline, r.BaselineGBps, r.Ratio)
	if g, ok := r.Goal(); ok {
		verdict := "met"
		if r.Ratio < g {
			verdict = "BELOW GOAL"
		}
		line += fmt.Sprintf(" (goal >= %.2f) %s", g, verdict)
	}
	return line
}

func sizeString(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// Config says what to measure. Zero values mean the defaults.
type Config struct {
	// Library is the CUDA driver library; default TENSORLANE_LIBCUDA,
	// else libcuda.so.1.
	Library string
	Device  int     // the GPU's ordinal; default 0
	Sizes   []int64 // default 256 MiB
	// Rounds is the timed (base, path) pairs per row after two warm-up
	// pairs; default 15.
	Rounds int
	// Paths picks rows; default all four.
	Paths []string
}

func (c *Config) defaults() {
	if len(c.Sizes) == 0 {
		c.Sizes = []int64{256 << 20}
	}
	if c.Rounds <= 0 {
		c.Rounds = 15
	}
	if len(c.Paths) == 0 {
		c.Paths = []string{PathD2D, PathIPCVMM, PathIPCLegacy, PathTCP}
	}
}

// Run measures the rows on the configured device. A row that cannot run
// here (the driver has no VMM for the VMM row, say) is a record with
// status skipped and the reason, not an error; a driver that is not there
// is an error.
func Run(ctx context.Context, cfg Config) ([]Row, error) {
	cfg.defaults()
	m, err := cuda.NewMemory(cuda.Config{Library: cfg.Library, Device: cfg.Device})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	mode := ModeGPU
	if strings.Contains(m.Info().Name, "test double") {
		mode = ModeFake
	}
	var recs []Row
	for _, n := range cfg.Sizes {
		for _, p := range cfg.Paths {
			r := Row{Path: p, Mode: mode, Size: n, Baseline: BaseDtoD}
			var base, path []time.Duration
			switch p {
			case PathD2D:
				base, path, err = d2d(ctx, m, n, cfg.Rounds)
			case PathIPCVMM, PathIPCLegacy:
				md := cuda.ModeVMM
				if p == PathIPCLegacy {
					md = cuda.ModeLegacy
				}
				if md == cuda.ModeVMM && !m.Info().VMM {
					r.Skipped = "the device has no VMM allocations"
					recs = append(recs, r)
					continue
				}
				base, path, err = crossProcess(ctx, cfg, md, n, cfg.Rounds)
			case PathTCP:
				r.Baseline = BaseRawTCP
				base, path, err = overTCP(ctx, m, n, cfg.Rounds)
			default:
				return recs, fmt.Errorf("devbench: no path %q (have %s, %s, %s, %s)", p, PathD2D, PathIPCVMM, PathIPCLegacy, PathTCP)
			}
			if err != nil {
				return recs, fmt.Errorf("devbench: %s %s: %w", p, sizeString(n), err)
			}
			bm, pm := median(base), median(path)
			r.GBps, r.BaselineGBps = float64(n)/pm.Seconds()/1e9, float64(n)/bm.Seconds()/1e9
			r.Rounds = len(path)
			r.Ratio = ratio(base, path)
			if mode == ModeFake {
				r.Note = "fake CUDA driver: copies are memcpy on the CPU; the figures mean nothing"
			}
			recs = append(recs, r)
		}
	}
	return recs, nil
}

// interleave times base and path alternately (the order swapping every
// round, so neither always runs warm), two warm-up pairs first.
func interleave(rounds int, base, path func() error) ([]time.Duration, []time.Duration, error) {
	var bt, pt []time.Duration
	for i := -2; i < rounds; i++ {
		fs := []func() error{base, path}
		outs := []*[]time.Duration{&bt, &pt}
		if i%2 != 0 {
			fs[0], fs[1], outs[0], outs[1] = fs[1], fs[0], outs[1], outs[0]
		}
		for k, f := range fs {
			t0 := time.Now()
			if err := f(); err != nil {
				return nil, nil, err
			}
			if i >= 0 {
				*outs[k] = append(*outs[k], time.Since(t0))
			}
		}
	}
	return bt, pt, nil
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// ratio is the median of the rounds' base/path: each pair ran back to
// back, so a burst of load skews a pair, not the median.
func ratio(base, path []time.Duration) float64 {
	r := make([]float64, len(base))
	for i := range base {
		r[i] = base[i].Seconds() / path[i].Seconds()
	}
	slices.Sort(r)
	return r[len(r)/2]
}

func fill(p []byte, seed byte) {
	for i := range p {
		p[i] = byte(i*131+i>>11) ^ seed
	}
}

func alloc(ctx context.Context, m *cuda.Memory, n int64) (*cuda.Buffer, error) {
	b, err := m.Alloc(ctx, n)
	if err != nil {
		return nil, err
	}
	return b.(*cuda.Buffer), nil
}

// check verifies that b holds want, once per row before timing.
func check(ctx context.Context, b *cuda.Buffer, want []byte) error {
	got := make([]byte, len(want))
	if err := b.CopyOut(ctx, 0, got); err != nil {
		return err
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("bytes differ from offset %d", i)
		}
	}
	return nil
}

// pin lends a device buffer to a transport as a pin: released by its
// owner, reached through Unwrap, exported for shm.
type pin struct{ b tensor.Buffer }

func (p pin) Device() tensor.DeviceID                       { return p.b.Device() }
func (p pin) Len() int64                                    { return p.b.Len() }
func (p pin) Release() error                                { return nil }
func (p pin) Export(a tensor.Access) (tensor.Handle, error) { return tensor.ExportOf(p.b, a) }
func (p pin) Unwrap() (tensor.Buffer, int64)                { return p.b, 0 }

func source(b tensor.Buffer) fabric.SourceFunc {
	return func(context.Context, fabric.Claim) (tensor.Buffer, error) { return pin{b}, nil }
}

// pair allocates a source holding a pattern (seed) and a destination of
// n bytes each on m; want is the pattern, for check.
func pair(ctx context.Context, m *cuda.Memory, n int64, seed byte) (src, dst *cuda.Buffer, want []byte, err error) {
	if src, err = alloc(ctx, m, n); err != nil {
		return nil, nil, nil, err
	}
	if dst, err = alloc(ctx, m, n); err != nil {
		src.Release()
		return nil, nil, nil, err
	}
	want = make([]byte, n)
	fill(want, seed)
	if err = src.CopyIn(ctx, 0, want); err != nil {
		src.Release()
		dst.Release()
		return nil, nil, nil, err
	}
	return src, dst, want, nil
}

// d2d: the in-process p2p transport's Get between two buffers of one GPU.
func d2d(ctx context.Context, m *cuda.Memory, n int64, rounds int) ([]time.Duration, []time.Duration, error) {
	src, dst, want, err := pair(ctx, m, n, 2)
	if err != nil {
		return nil, nil, err
	}
	defer src.Release()
	defer dst.Release()
	tr := local.NewP2P(local.Config{Source: source(src)})
	remote := fabric.Remote{Claim: fabric.Claim{Object: fabric.ObjectID{1}, Incarnation: 1}, Length: n}
	get := func() error { _, err := tr.Read(ctx, remote, dst); return err }
	if err := get(); err != nil {
		return nil, nil, err
	}
	if err := check(ctx, dst, want); err != nil {
		return nil, nil, err
	}
	return interleave(rounds, func() error { return cuda.MemcpyBaseline(dst, src, n) }, get)
}

// overTCP: device → host staging → tcp over loopback → host staging →
// device, against raw TCP of host memory over one loopback connection.
func overTCP(ctx context.Context, m *cuda.Memory, n int64, rounds int) ([]time.Duration, []time.Duration, error) {
	src, dst, want, err := pair(ctx, m, n, 5)
	if err != nil {
		return nil, nil, err
	}
	defer src.Release()
	defer dst.Release()
	okey, oid, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	srv, err := tcp.Listen(tcp.ServerConfig{Security: fabric.Security{Identity: okey}, Source: source(src)})
	if err != nil {
		return nil, nil, err
	}
	defer srv.Close()
	rkey, _, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	tr, err := tcp.New(tcp.Config{Security: fabric.Security{Identity: rkey}, Compression: tcp.CompressOff})
	if err != nil {
		return nil, nil, err
	}
	defer tr.Close()
	remote := fabric.Remote{Peer: oid.String(), Addrs: map[string]string{fabric.TCP: srv.Addr()},
		Claim: fabric.Claim{Object: fabric.ObjectID{3}, Incarnation: 1}, Length: n}
	get := func() error { _, err := tr.Read(ctx, remote, dst); return err }
	if err := get(); err != nil {
		return nil, nil, err
	}
	if err := check(ctx, dst, want); err != nil {
		return nil, nil, err
	}
	raw, stop, err := RawTCP(n)
	if err != nil {
		return nil, nil, err
	}
	defer stop()
	return interleave(rounds, raw, get)
}

func newKey() (crypto.PrivKey, peer.ID, error) {
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, "", err
	}
	id, err := peer.IDFromPrivateKey(k)
	return k, id, err
}

// RawTCP returns a function that moves n bytes of host memory over one
// loopback TCP connection (the baseline of a device path over tcp), and its
// stop.
func RawTCP(n int64) (func() error, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	src := make([]byte, n)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var one [1]byte
		for {
			if _, err := io.ReadFull(c, one[:]); err != nil {
				return
			}
			if _, err := c.Write(src); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		<-done
		return nil, nil, err
	}
	dst := make([]byte, n)
	read := func() error {
		if _, err := c.Write([]byte{1}); err != nil {
			return err
		}
		_, err := io.ReadFull(c, dst)
		return err
	}
	return read, func() { c.Close(); ln.Close(); <-done }, nil
}

// ownerEnv makes a process the owner of the cross-process rows (Owner).
const ownerEnv = "TENSORLANE_DEVBENCH_OWNER"

type ownerInfo struct{ Addr, Peer string }

// Owner runs this process as the owner of a cross-process row when the
// environment says it was started as one, and returns its exit status and
// true; otherwise it returns false at once. A program that runs Run calls
// it first thing in main (or TestMain): the owner is this same binary,
// started again.
func Owner() (int, bool) {
	spec := os.Getenv(ownerEnv)
	if spec == "" {
		return 0, false
	}
	if err := serveOwner(spec); err != nil {
		fmt.Fprintln(os.Stderr, "devbench owner:", err)
		return 2, true
	}
	return 0, true
}

// serveOwner: one object of n bytes on the device, in the mode the spec
// names ("n,mode,device,library"), served over shm until stdin closes.
func serveOwner(spec string) error {
	f := strings.SplitN(spec, ",", 4)
	if len(f) != 4 {
		return fmt.Errorf("bad %s %q", ownerEnv, spec)
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return err
	}
	dev, err := strconv.Atoi(f[2])
	if err != nil {
		return err
	}
	md := cuda.ModeVMM
	if f[1] == cuda.ModeLegacy.String() {
		md = cuda.ModeLegacy
	}
	ctx := context.Background()
	m, err := cuda.NewMemory(cuda.Config{Library: f[3], Device: dev, Mode: md})
	if err != nil {
		return err
	}
	defer m.Close()
	b, err := alloc(ctx, m, n)
	if err != nil {
		return err
	}
	defer b.Release()
	p := make([]byte, n)
	fill(p, 4)
	if err := b.CopyIn(ctx, 0, p); err != nil {
		return err
	}
	key, id, err := newKey()
	if err != nil {
		return err
	}
	srv, err := shm.Listen(shm.ServerConfig{Security: fabric.Security{Identity: key}, Source: source(b)})
	if err != nil {
		return err
	}
	defer srv.Close()
	line, _ := json.Marshal(ownerInfo{Addr: srv.Addr(), Peer: id.String()})
	fmt.Println(string(line))
	io.Copy(io.Discard, os.Stdin)
	return nil
}

// crossProcess: a Get over shm (the allocation's handle across the
// authenticated socket, imported here, the GPU copies) from an owner
// process on the same GPU, against cuMemcpyDtoD of the same size.
func crossProcess(ctx context.Context, cfg Config, md cuda.Mode, n int64, rounds int) ([]time.Duration, []time.Duration, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.CommandContext(ctx, self, "-test.run=^$") // a test binary's flag; the tensorlane command exits in Owner first
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%s,%d,%s", ownerEnv, n, md, cfg.Device, cfg.Library))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		return nil, nil, errors.New("the owner process exited before serving")
	}
	var info ownerInfo
	if err := json.Unmarshal(sc.Bytes(), &info); err != nil {
		return nil, nil, fmt.Errorf("the owner said %q", sc.Text())
	}
	go io.Copy(io.Discard, stdout)

	m, err := cuda.NewMemory(cuda.Config{Library: cfg.Library, Device: cfg.Device, Mode: md})
	if err != nil {
		return nil, nil, err
	}
	defer m.Close()
	dst, err := alloc(ctx, m, n)
	if err != nil {
		return nil, nil, err
	}
	defer dst.Release()
	scratch, err := alloc(ctx, m, n)
	if err != nil {
		return nil, nil, err
	}
	defer scratch.Release()
	key, _, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	cli, err := shm.NewClient(shm.Config{Security: fabric.Security{Identity: key}})
	if err != nil {
		return nil, nil, err
	}
	defer cli.Close()
	remote := fabric.Remote{Peer: info.Peer, Addrs: map[string]string{fabric.P2P: info.Addr},
		Claim: fabric.Claim{Object: fabric.ObjectID{7}, Incarnation: 1}, Length: n}
	get := func() error { _, err := cli.P2P().Read(ctx, remote, dst); return err }
	if err := get(); err != nil {
		return nil, nil, err
	}
	want := make([]byte, n)
	fill(want, 4)
	if err := check(ctx, dst, want); err != nil {
		return nil, nil, err
	}
	return interleave(rounds, func() error { return cuda.MemcpyBaseline(scratch, dst, n) }, get)
}
