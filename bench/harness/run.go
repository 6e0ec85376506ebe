package harness

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/bench"
	"github.com/tensorlane/tensorlane/fabric/stack"
	"github.com/tensorlane/tensorlane/fabric/tcp"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Result is a finished run.
type Result struct {
	Quick   bool
	Records []Record
	PeakRSS int64
	Elapsed time.Duration
}

// File returns r in the results.json / baseline format.
func (r Result) File() File {
	return File{
		Version: FileVersion, Created: time.Now().UTC().Truncate(time.Second), Quick: r.Quick,
		GoVersion: runtime.Version(), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, CPUs: runtime.NumCPU(),
		PeakRSS: r.PeakRSS, Elapsed: r.Elapsed.Seconds(), Records: r.Records,
	}
}

// ErrWrongPath fails a run whose transfer took another transport than the
// cell it was timed for names: a benchmark must never report one path's
// numbers under another's name.
var ErrWrongPath = errors.New("harness: transfer took another path than the cell measures")

// cellSpec is one (path, mode) of the matrix.
type cellSpec struct{ path, mode string }

func cells(cfg Config) []cellSpec {
	var out []cellSpec
	for _, p := range slices.Concat(AllPaths, OptInPaths) {
		if slices.Contains(cfg.Paths, p) {
			out = append(out, cellSpec{p, ModePull})
		}
		if slices.Contains(cfg.Push, p) {
			out = append(out, cellSpec{p, ModePush})
		}
	}
	return out
}

// Run measures the matrix cfg selects on a simulated cluster of two
// dgx-h100 hosts built in this process, with one rdt runtime per role
// talking over loopback: the owner's runtime on host h0 (local: a Get on
// the owner's own GPU; p2p: onto an NVLink-linked GPU of the same runtime),
// a second runtime claiming h0 too (p2p-ipc onto its NVLink-linked GPU and
// shm into its host memory, both through fabric/shm as between two
// processes), and runtimes on host h1 for rdma (the default there), tcp
// (rdma off, compression off) and tcp-z (rdma off, compression always).
// Paths run one after another, each in a cluster started for it. Every
// runtime, socket and goroutine it starts is closed before it returns.
func Run(ctx context.Context, cfg Config) (res Result, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return res, err
	}
	start := time.Now()
	res.Quick = cfg.Quick
	specs := cells(cfg)
	latency := !cfg.NoLatency && slices.Contains(cfg.Paths, PathTCP) && len(cfg.LatencySizes) > 0
	total := len(cfg.Sizes) * len(specs) * len(cfg.Concurrency)
	if latency {
		total += len(cfg.LatencySizes)
	}
	done := 0
	emit := func(recs ...Record) {
		res.Records = append(res.Records, recs...)
		done++
		if cfg.Progress != nil {
			cfg.Progress(done, total, recs)
		}
	}
	// One path at a time, each in a cluster of its own: a reader
	// runtime's arena keeps the pages its largest cell touched until the
	// runtime closes, so sharing one cluster across paths would hold the
	// largest in-flight bytes once per reader at the same time.
	for _, path := range slices.Concat(AllPaths, OptInPaths) {
		var pspecs []cellSpec
		for _, sp := range specs {
			if sp.path == path {
				pspecs = append(pspecs, sp)
			}
		}
		lat := latency && path == PathTCP
		if len(pspecs) == 0 && !lat {
			continue
		}
		if err := runPath(ctx, cfg, pspecs, lat, emit); err != nil {
			return res, err
		}
	}
	res.PeakRSS = PeakRSS()
	res.Elapsed = time.Since(start)
	return res, nil
}

// runPath measures specs (the cells of one path) and, with lat, the
// latency mode, in a cluster started for them and closed before it returns.
func runPath(ctx context.Context, cfg Config, specs []cellSpec, lat bool, emit func(...Record)) (err error) {
	env, err := newEnv(ctx, cfg, specs, lat)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := env.close(); err == nil {
			err = cerr
		}
	}()
	for _, size := range cfg.Sizes {
		if len(specs) == 0 {
			break
		}
		sz, err := env.prepare(ctx, size, specs)
		if err != nil {
			return err
		}
		for _, spec := range specs {
			maxC := 0
			for _, c := range cfg.Concurrency {
				if int64(c)*size <= cfg.MaxInFlight {
					maxC = max(maxC, c)
				}
			}
			g, err := sz.group(ctx, spec, maxC)
			if err != nil {
				sz.close()
				return fmt.Errorf("harness: %s %s %s: %w", spec.path, spec.mode, SizeString(size), err)
			}
			for _, c := range cfg.Concurrency {
				if int64(c)*size > cfg.MaxInFlight {
					emit(Record{Kind: KindThroughput, Path: spec.path, Mode: spec.mode, Size: size, Concurrency: c,
						Status: StatusSkipped, Note: fmt.Sprintf("%s in flight exceeds MaxInFlight %s", SizeString(int64(c)*size), SizeString(cfg.MaxInFlight))})
					continue
				}
				recs, err := g.cell(ctx, cfg, c)
				if err != nil {
					g.close()
					sz.close()
					return fmt.Errorf("harness: %s %s %s x%d: %w", spec.path, spec.mode, SizeString(size), c, err)
				}
				emit(recs...)
			}
			if err := g.close(); err != nil {
				sz.close()
				return err
			}
		}
		if err := sz.close(); err != nil {
			return err
		}
	}
	if lat {
		for _, size := range cfg.LatencySizes {
			r, err := env.latency(ctx, cfg, size)
			if err != nil {
				return fmt.Errorf("harness: latency %s: %w", SizeString(size), err)
			}
			emit(r)
		}
	}
	return nil
}

var (
	srcDev  = tensor.GPUDevice(0)
	nearDev = tensor.GPUDevice(1) // NVLink-linked to GPU 0 in dgx-h100
)

// env is the simulated cluster: the owner's runtime and one runtime per
// reading role, started only when a cell needs it.
type env struct {
	ra    *rdt.Runtime // h0: the owner, and the p2p reader
	rc    *rdt.Runtime // h0 again: another process to the planner (p2p-ipc, shm)
	rr    *rdt.Runtime // h1: rdma
	rt    *rdt.Runtime // h1, rdma off, compression off: tcp
	rz    *rdt.Runtime // h1, rdma off, compression always: tcp-z
	owner *rdt.Actor
	// The rdma-ofi pair: an owner on h0 and a reader on h1 whose rdma
	// provider is libfabric (started only for that path).
	ro, rof *rdt.Runtime
	oowner  *rdt.Actor
	// readers and their destination device per path.
	readers map[string]*rdt.Actor
	devs    map[string]tensor.DeviceID
	mems    map[string]tensor.Memory
	// rts are the runtimes started, for close.
	rts []*rdt.Runtime
	// zlog sees rz's tcp transfers: what the codec put on the wire.
	zlog *wireLog
}

func newEnv(ctx context.Context, cfg Config, specs []cellSpec, latency bool) (*env, error) {
	cl, err := topology.Preset("dgx-h100", 2)
	if err != nil {
		return nil, err
	}
	maxSize := slices.Max(append(slices.Clone(cfg.Sizes), cfg.LatencySizes...))
	inflight := int64(0)
	for _, s := range cfg.Sizes {
		for _, c := range cfg.Concurrency {
			if b := s * int64(c); b <= cfg.MaxInFlight && b > inflight {
				inflight = b
			}
		}
	}
	// Arenas are sparse memfds: the cap costs only the pages written. The
	// owner's GPU holds two sources (a byte pattern and bf16 weights).
	devMem := 2*maxSize + inflight + 64<<20
	need := map[string]bool{}
	for _, s := range specs {
		need[s.path] = true
	}
	if latency {
		need[PathTCP] = true
	}
	e := &env{readers: map[string]*rdt.Actor{}, devs: map[string]tensor.DeviceID{}, mems: map[string]tensor.Memory{}, zlog: &wireLog{}}
	start := func(host string, mutate func(*rdt.Config)) (*rdt.Runtime, error) {
		// Heartbeats are relaxed: a cell that saturates both cores (the codec
		// at 8 in flight) must not get its owner declared dead; failure
		// detection is tested elsewhere, not measured here.
		c := rdt.Config{Cluster: cl, Host: host, IgnoreEnv: true, DeviceMemory: devMem, Transports: stack.Config{Compression: tcp.CompressOff},
			RuntimeDir:        rdt.ProcessRuntimeDir(), // the whole cluster lives in this process
			HeartbeatInterval: 5 * time.Second, HeartbeatMisses: 6}
		if mutate != nil {
			mutate(&c)
		}
		r, err := rdt.New(ctx, c)
		if err == nil {
			e.rts = append(e.rts, r)
		}
		return r, err
	}
	reader := func(r *rdt.Runtime, path, name string, dev tensor.DeviceID) error {
		a, err := r.Spawn(name)
		if err != nil {
			return err
		}
		mem, err := r.Memory(dev)
		if err != nil {
			return err
		}
		e.readers[path], e.devs[path], e.mems[path] = a, dev, mem
		return nil
	}
	err = func() error {
		if e.ra, err = start("h0", nil); err != nil {
			return err
		}
		if e.owner, err = e.ra.Spawn("bench-owner"); err != nil {
			return err
		}
		if err := reader(e.ra, PathLocal, "bench-local", srcDev); err != nil {
			return err
		}
		if err := reader(e.ra, PathP2P, "bench-p2p", nearDev); err != nil {
			return err
		}
		if need[PathP2PIPC] || need[PathSHM] {
			if e.rc, err = start("h0", nil); err != nil {
				return err
			}
			if err := reader(e.rc, PathP2PIPC, "bench-p2p-ipc", nearDev); err != nil {
				return err
			}
			if err := reader(e.rc, PathSHM, "bench-shm", tensor.HostDevice); err != nil {
				return err
			}
		}
		if need[PathRDMA] {
			if e.rr, err = start("h1", nil); err != nil {
				return err
			}
			if err := reader(e.rr, PathRDMA, "bench-rdma", nearDev); err != nil {
				return err
			}
		}
		if need[PathRDMAOFI] {
			ofi := func(c *rdt.Config) { c.Transports.RDMAProviderKind = "ofi" }
			if e.ro, err = start("h0", ofi); err != nil {
				return err
			}
			if e.oowner, err = e.ro.Spawn("bench-ofi-owner"); err != nil {
				return err
			}
			if e.rof, err = start("h1", ofi); err != nil {
				return err
			}
			if err := reader(e.rof, PathRDMAOFI, "bench-rdma-ofi", nearDev); err != nil {
				return err
			}
		}
		if need[PathTCP] {
			if e.rt, err = start("h1", func(c *rdt.Config) { c.Transports.DisableRDMA = true }); err != nil {
				return err
			}
			if err := reader(e.rt, PathTCP, "bench-tcp", nearDev); err != nil {
				return err
			}
		}
		if need[PathTCPZ] {
			if e.rz, err = start("h1", func(c *rdt.Config) {
				c.Transports.DisableRDMA, c.Transports.Compression, c.Logger = true, tcp.CompressAlways, slog.New(e.zlog)
			}); err != nil {
				return err
			}
			if err := reader(e.rz, PathTCPZ, "bench-tcp-z", nearDev); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *env) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	// Readers first, the owner last, so no reader outlives its owner.
	for i := len(e.rts) - 1; i >= 0; i-- {
		if err := e.rts[i].Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	e.rts = nil
	return errors.Join(errs...)
}

// put places a size-byte tensor on the owner's GPU: a byte pattern, or for
// bf16 weights normally distributed values (what the tcp codec is for).
func (e *env) put(ctx context.Context, size int64, bf16 bool) (rdt.Ref, []byte, error) {
	return e.putOn(ctx, e.ra, e.owner, size, bf16)
}

func (e *env) putOn(ctx context.Context, rt *rdt.Runtime, owner *rdt.Actor, size int64, bf16 bool) (rdt.Ref, []byte, error) {
	mem, err := rt.Memory(srcDev)
	if err != nil {
		return rdt.Ref{}, nil, err
	}
	dt, n := tensor.Uint8, size
	if bf16 {
		dt, n = tensor.BFloat16, size/2
	}
	x, err := tensor.Alloc(ctx, mem, dt, n)
	if err != nil {
		return rdt.Ref{}, nil, err
	}
	p, err := x.SpanBytes()
	if err != nil {
		x.Release()
		return rdt.Ref{}, nil, err
	}
	if bf16 {
		fillBF16Normal(p)
	} else {
		for i := range p {
			p[i] = byte(i*7 + i>>8)
		}
	}
	// Sealed: the bench never writes a source again, so its tcp checksums
	// are computed by the warm-up read and cached (rdt.Sealed).
	ref, err := owner.Put(ctx, x, rdt.Sealed())
	if err != nil {
		x.Release()
		return rdt.Ref{}, nil, err
	}
	return ref, p, nil
}

// fillBF16Normal writes bf16 values drawn from N(0, 0.02), a typical
// weight distribution, little-endian, with a fixed seed.
func fillBF16Normal(p []byte) {
	rng := rand.New(rand.NewPCG(7, 11))
	for i := 0; i+1 < len(p); i += 2 {
		bits := math.Float32bits(float32(rng.NormFloat64() * 0.02))
		bits += 0x7fff + (bits>>16)&1 // round to nearest even
		binary.LittleEndian.PutUint16(p[i:], uint16(bits>>16))
	}
}

// sized holds what the cells of one size share: the sources, the
// baselines' heap destinations and connections.
type sized struct {
	e       *env
	size    int64
	ref     rdt.Ref // byte pattern
	src     []byte
	zref    rdt.Ref // bf16 normal weights, for tcp-z
	zsrc    []byte
	hasZ    bool
	oref    rdt.Ref // the byte pattern again, on the rdma-ofi owner
	hasO    bool
	heapDst [][]byte
	hser    []*bench.Serializer // on-host paths
	net     sockets             // network paths, from src
	znet    sockets             // tcp-z, from zsrc
}

// sockets are the socket baselines of one source: a raw TCP pair and a
// serialize pair per worker, and one libp2p pair (measured at 1 in flight).
type sockets struct {
	raw []*bench.TCPPair
	ser []*bench.SerializePair
	lp  *bench.Libp2pPair
}

// grow gives c workers their pairs sending src.
func (n *sockets) grow(ctx context.Context, src []byte, c int) error {
	for len(n.raw) < c {
		p, err := bench.NewTCPPair(src)
		if err != nil {
			return err
		}
		n.raw = append(n.raw, p)
	}
	for len(n.ser) < c {
		p, err := bench.NewSerializePair(src)
		if err != nil {
			return err
		}
		n.ser = append(n.ser, p)
	}
	if n.lp == nil && c == 1 {
		p, err := bench.NewLibp2pPair(ctx, src)
		if err != nil {
			return err
		}
		n.lp = p
	}
	return nil
}

func (n *sockets) close() error {
	var errs []error
	for _, p := range n.raw {
		errs = append(errs, p.Close())
	}
	for _, p := range n.ser {
		errs = append(errs, p.Close())
	}
	if n.lp != nil {
		errs = append(errs, n.lp.Close())
	}
	*n = sockets{}
	return errors.Join(errs...)
}

func (e *env) prepare(ctx context.Context, size int64, specs []cellSpec) (*sized, error) {
	ref, src, err := e.put(ctx, size, false)
	if err != nil {
		return nil, err
	}
	s := &sized{e: e, size: size, ref: ref, src: src}
	if slices.Contains(specs, cellSpec{PathTCPZ, ModePull}) {
		if s.zref, s.zsrc, err = e.put(ctx, size, true); err != nil {
			s.close()
			return nil, err
		}
		s.hasZ = true
	}
	if s.e.oowner != nil {
		if s.oref, _, err = e.putOn(ctx, e.ro, e.oowner, size, false); err != nil {
			s.close()
			return nil, err
		}
		s.hasO = true
	}
	return s, nil
}

func (s *sized) close() error {
	errs := []error{s.net.close(), s.znet.close()}
	if s.src != nil {
		errs = append(errs, s.e.owner.Free(context.Background(), s.ref))
	}
	if s.hasZ {
		errs = append(errs, s.e.owner.Free(context.Background(), s.zref))
	}
	if s.hasO {
		errs = append(errs, s.e.oowner.Free(context.Background(), s.oref))
		s.hasO = false
	}
	s.hser, s.heapDst, s.src, s.zsrc, s.hasZ = nil, nil, nil, nil, false
	return errors.Join(errs...)
}

// ucxTLS is the UCX transport each path is compared with (UCX_TLS): on
// one host "sm", UCX's shared-memory set (posix or sysv for small
// messages, cma's single copy for large ones), which is what UCX picks
// there; posix alone moves 64 MiB at about 0.1 GB/s.
var ucxTLS = map[string]string{PathTCP: "tcp", PathSHM: "sm"}

// network reports whether path crosses hosts (its baselines are sockets).
func network(path string) bool {
	return path == PathRDMA || path == PathRDMAOFI || path == PathTCP || path == PathTCPZ
}

// baselines grows what the baselines of spec need for c workers.
func (s *sized) baselines(ctx context.Context, spec cellSpec, c int) error {
	for len(s.heapDst) < c {
		b := make([]byte, s.size)
		copy(b, s.src) // fault the pages in, as the arenas' are after warm-up
		s.heapDst = append(s.heapDst, b)
	}
	if !network(spec.path) {
		for len(s.hser) < c {
			s.hser = append(s.hser, bench.NewSerializer(s.src))
		}
		return nil
	}
	if spec.path == PathTCPZ {
		return s.znet.grow(ctx, s.zsrc, c)
	}
	return s.net.grow(ctx, s.src, c)
}

// group is one (size, path, mode): the reader's destinations (pull) or
// slots (push), grown to the largest in-flight count, released together.
type group struct {
	s     *sized
	spec  cellSpec
	ref   rdt.Ref
	dsts  []tensor.Tensor
	slots []*rdt.Slot
	sref  []rdt.Ref
	seen  []uint64 // pushes each slot has completed
}

func (s *sized) group(ctx context.Context, spec cellSpec, c int) (*group, error) {
	g := &group{s: s, spec: spec, ref: s.ref}
	if spec.path == PathTCPZ {
		g.ref = s.zref
	}
	if spec.path == PathRDMAOFI {
		g.ref = s.oref
	}
	if spec.path == PathLocal {
		return g, nil
	}
	e := s.e
	reader, dev, mem := e.readers[spec.path], e.devs[spec.path], e.mems[spec.path]
	for range c {
		if spec.mode == ModePush {
			slot, err := reader.Reserve(ctx, g.ref.Desc, dev)
			if err != nil {
				g.close()
				return nil, err
			}
			g.slots = append(g.slots, slot)
			g.sref = append(g.sref, slot.Ref())
			g.seen = append(g.seen, 0)
			continue
		}
		t, err := tensor.Alloc(ctx, mem, tensor.Uint8, s.size)
		if err != nil {
			g.close()
			return nil, err
		}
		g.dsts = append(g.dsts, t)
	}
	return g, nil
}

func (g *group) close() error {
	var errs []error
	for _, t := range g.dsts {
		errs = append(errs, t.Release())
	}
	for _, sl := range g.slots {
		errs = append(errs, sl.Close())
	}
	g.dsts, g.slots, g.sref = nil, nil, nil
	return errors.Join(errs...)
}

type op func(ctx context.Context, worker int) error

// checkPath fails a transfer that took another transport than the cell's.
func (g *group) checkPath(x rdt.Transfer) error {
	if want := Transport(g.spec.path); x.Stats.Transport != want {
		return fmt.Errorf("%w: %s %s cell wants %s, the transfer took %q (plan: %v)", ErrWrongPath, g.spec.path, g.spec.mode, want, x.Stats.Transport, x.Plan)
	}
	return nil
}

// measure is the timed operation of g's cell on one worker.
func (g *group) measure() op {
	e, spec := g.s.e, g.spec
	switch {
	case spec.path == PathLocal:
		return func(ctx context.Context, _ int) error {
			v, x, err := e.readers[PathLocal].Fetch(ctx, g.ref, srcDev)
			if err != nil {
				return err
			}
			if err := g.checkPath(x); err != nil {
				v.Release()
				return err
			}
			return v.Release()
		}
	case spec.mode == ModePush:
		return func(ctx context.Context, w int) error {
			owner := e.owner
			if spec.path == PathRDMAOFI {
				owner = e.oowner
			}
			x, err := owner.Push(ctx, g.ref, g.sref[w])
			if err != nil {
				return err
			}
			if err := g.checkPath(x); err != nil {
				return err
			}
			// The push counts once the reader saw it complete.
			n, _, err := g.slots[w].Wait(ctx, g.seen[w])
			g.seen[w] = n
			return err
		}
	}
	reader := e.readers[spec.path]
	return func(ctx context.Context, w int) error {
		x, err := reader.GetInto(ctx, g.ref, g.dsts[w])
		if err != nil {
			return err
		}
		return g.checkPath(x)
	}
}

// wireLog counts what the tcp transport reports of each transfer it made
// ("tcp transfer" debug records: bytes, wire bytes, compressed). It is how
// the harness sees the codec at work, since rdt does not register the tcp
// transport's compression counters in its registry.
type wireLog struct {
	mu        sync.Mutex
	raw, wire float64 // bytes of compressed transfers, before and on the wire
	plain     float64 // bytes of transfers that went uncompressed
	attrs     []slog.Attr
}

func (h *wireLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *wireLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *wireLog) WithGroup(string) slog.Handler            { return h }
func (h *wireLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "tcp transfer" {
		return nil
	}
	var n, wire float64
	var compressed bool
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "bytes":
			n = float64(a.Value.Int64())
		case "wire":
			wire = float64(a.Value.Int64())
		case "compressed":
			compressed = a.Value.Bool()
		}
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	if compressed {
		h.raw += n
		h.wire += wire
	} else {
		h.plain += n
	}
	return nil
}

func (h *wireLog) counts() (raw, wire, plain float64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.raw, h.wire, h.plain
}

// cell measures one (path, mode, size, concurrency) against its baselines.
func (g *group) cell(ctx context.Context, cfg Config, c int) ([]Record, error) {
	s, path := g.s, g.spec.path
	if err := s.baselines(ctx, g.spec, c); err != nil {
		return nil, err
	}
	measure, err := slowed(path, g.measure())
	if err != nil {
		return nil, err
	}
	type base struct {
		name string
		op   op
	}
	// timed baselines time themselves (k operations per round).
	timed := map[string]func(ctx context.Context, k int) (wall, cpu time.Duration, err error){}
	var bases []base
	if network(path) {
		n := &s.net
		if path == PathTCPZ {
			n = &s.znet
		}
		bases = []base{
			{BaseRawTCP, func(_ context.Context, w int) error { _, err := n.raw[w].Read(s.heapDst[w]); return err }},
			{BaseSerialize, func(_ context.Context, w int) error { _, err := n.ser[w].Read(s.heapDst[w]); return err }},
		}
		if c == 1 {
			bases = append(bases, base{BaseLibp2p, func(_ context.Context, w int) error { _, err := n.lp.Read(s.heapDst[w]); return err }})
		}
	} else {
		bases = []base{
			{BaseMemcpy, func(_ context.Context, w int) error { copy(s.heapDst[w], s.src); return nil }},
			{BaseSerialize, func(_ context.Context, w int) error { _, err := s.hser[w].Read(s.heapDst[w]); return err }},
		}
	}
	// UCX beside tcp and shm when ucx_perftest is installed (bench/ucx.go),
	// outside --quick: the quick matrix is the regression guard's, whose
	// stored baseline must not depend on what a machine has installed.
	// UCX's own window (many messages in flight) at every concurrency,
	// and at one Get in flight also one message in flight: like with like
	// both ways (BaseUCXTCP1). A round of the path moves k*c transfers, so
	// UCX's is timed for as many messages.
	if tls := ucxTLS[path]; tls != "" && g.spec.mode == ModePull && !cfg.Quick && !cfg.NoUCX && s.size >= UCXMinSize && bench.UCXAvailable() {
		us := []bench.UCX{{TLS: tls, Size: s.size}}
		if c == 1 {
			us = append(us, bench.UCX{TLS: tls, Size: s.size, Outstanding: 1})
		}
		for _, u := range us {
			bases = append(bases, base{u.Name(), nil})
			timed[u.Name()] = func(ctx context.Context, k int) (time.Duration, time.Duration, error) {
				return u.RoundCPU(ctx, k*c)
			}
		}
	}
	// Enough operations per worker per round that a round moves about
	// 1 MiB, so small sizes are not timer-bound.
	k := int((1<<20 + s.size*int64(c) - 1) / (s.size * int64(c)))
	if k < 1 {
		k = 1
	}
	// Warm-up: connections, page faults, first-use allocations.
	if _, err := round(ctx, measure, c, 1); err != nil {
		return nil, err
	}
	for _, b := range bases {
		if timed[b.name] != nil {
			continue // its rounds warm up on their own
		}
		if _, err := round(ctx, b.op, c, 1); err != nil {
			return nil, err
		}
	}
	zraw0, zwire0, zplain0 := s.e.zlog.counts()
	var pathTotal time.Duration
	var pathRounds []float64  // seconds per round, for the per-round figures the A/B guard compares
	var pathCPU time.Duration // process CPU time spent in the path's rounds
	baseTotal := make([]time.Duration, len(bases))
	baseCPU := make([]time.Duration, len(bases))
	ratios := make([][]float64, len(bases))
	// A timed baseline that fails (UCX's processes: a foreign tool that
	// may hang or refuse on a busy machine) loses its row, loudly; the
	// path and the other baselines are still measured.
	dropped := make([]bool, len(bases))
	var alloc uint64
	var ms runtime.MemStats
	began := time.Now()
	rounds := 0
	for rounds < cfg.MinRounds || (time.Since(began) < cfg.MinTime && rounds < cfg.MaxRounds) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		cpu0 := cpuTime()
		pt, err := round(ctx, measure, c, k)
		if err != nil {
			return nil, err
		}
		pathCPU += cpuTime() - cpu0
		runtime.ReadMemStats(&ms)
		alloc += ms.TotalAlloc - before
		pathTotal += pt
		pathRounds = append(pathRounds, pt.Seconds())
		for i := range bases {
			j := (i + rounds) % len(bases) // rotate the order of baselines
			var bt, bcpu time.Duration
			var err error
			if dropped[j] {
				continue
			}
			if f := timed[bases[j].name]; f != nil {
				if bt, bcpu, err = f(ctx, k); err != nil && ctx.Err() == nil {
					slog.Warn("bench: baseline dropped from this cell", "baseline", bases[j].name, "path", path, "size", s.size, "err", err)
					dropped[j] = true
					continue
				}
			} else {
				cpu0 := cpuTime()
				bt, err = round(ctx, bases[j].op, c, k)
				bcpu = cpuTime() - cpu0
			}
			if err != nil {
				return nil, fmt.Errorf("baseline %s: %w", bases[j].name, err)
			}
			baseTotal[j] += bt
			baseCPU[j] += bcpu
			ratios[j] = append(ratios[j], bt.Seconds()/pt.Seconds())
		}
		rounds++
	}
	moved := float64(rounds) * float64(k) * float64(c) * float64(s.size)
	var wireRatio float64
	note := ""
	switch path {
	case PathLocal:
		note = "zero-copy view"
	case PathTCPZ:
		zraw1, zwire1, zplain1 := s.e.zlog.counts()
		if zraw1-zraw0 < moved || zplain1 > zplain0 {
			// The cell says compressed: every timed byte must have been.
			return nil, fmt.Errorf("%w: tcp-z compressed %.0f of %.0f bytes moved (%.0f sent plain)", ErrWrongPath, zraw1-zraw0, moved, zplain1-zplain0)
		}
		wireRatio = (zwire1 - zwire0) / (zraw1 - zraw0)
		note = fmt.Sprintf("bf16 N(0,0.02); wire %.0f%% of raw", 100*wireRatio)
	}
	gbps := moved / pathTotal.Seconds() / 1e9
	roundBytes := float64(k) * float64(c) * float64(s.size)
	rss := PeakRSS()
	recs := make([]Record, 0, len(bases))
	for i, b := range bases {
		if dropped[i] {
			continue
		}
		recs = append(recs, Record{
			Kind: KindThroughput, Path: path, Mode: g.spec.mode, Size: s.size, Concurrency: c,
			GBps: gbps, Baseline: b.name, BaselineGBps: moved / baseTotal[i].Seconds() / 1e9,
			Ratio: median(ratios[i]), Rounds: rounds, WireRatio: wireRatio,
			MedianGBps: roundBytes / median(pathRounds) / 1e9, BestGBps: roundBytes / slices.Min(pathRounds) / 1e9,
			CPUGBps:         moved / pathCPU.Seconds() / 1e9,
			BaselineCPUGBps: cpuRate(moved, baseCPU[i]),
			AllocPerGiB:     float64(alloc) / (moved / (1 << 30)), PeakRSS: rss, Note: note,
		})
	}
	return recs, nil
}

// cpuRate is bytes moved per second of CPU in GB/s, 0 when no CPU time
// was seen (a baseline without a CPU figure).
func cpuRate(moved float64, cpu time.Duration) float64 {
	if cpu <= 0 {
		return 0
	}
	return moved / cpu.Seconds() / 1e9
}

// round runs k operations on each of c workers at once and returns the
// wall time until all are done.
func round(ctx context.Context, f op, c, k int) (time.Duration, error) {
	start := time.Now()
	if c == 1 {
		for range k {
			if err := f(ctx, 0); err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	}
	var wg sync.WaitGroup
	errs := make([]error, c)
	for w := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range k {
				if errs[w] = f(ctx, w); errs[w] != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	return d, errors.Join(errs...)
}

// latency times single small tcp Gets (rdma off, compression off),
// interleaved one for one with a raw TCP ping-pong of the same bytes.
func (e *env) latency(ctx context.Context, cfg Config, size int64) (Record, error) {
	ref, src, err := e.put(ctx, size, false)
	if err != nil {
		return Record{}, err
	}
	defer e.owner.Free(context.Background(), ref)
	reader := e.readers[PathTCP]
	dst, err := tensor.Alloc(ctx, e.mems[PathTCP], tensor.Uint8, size)
	if err != nil {
		return Record{}, err
	}
	defer dst.Release()
	g := &group{spec: cellSpec{PathTCP, ModePull}}
	pp, err := bench.NewPingPong(src)
	if err != nil {
		return Record{}, err
	}
	defer pp.Close()
	buf := make([]byte, size)
	n := cfg.LatencySamples
	path := make([]float64, 0, n)
	base := make([]float64, 0, n)
	const warm = 10
	for i := 0; i < n+warm; i++ {
		if err := ctx.Err(); err != nil {
			return Record{}, err
		}
		t0 := time.Now()
		x, err := reader.GetInto(ctx, ref, dst)
		if err != nil {
			return Record{}, err
		}
		d := time.Since(t0)
		if err := g.checkPath(x); err != nil {
			return Record{}, err
		}
		bd, err := pp.Exchange(buf)
		if err != nil {
			return Record{}, err
		}
		if i >= warm {
			path = append(path, float64(d.Nanoseconds())/1e3)
			base = append(base, float64(bd.Nanoseconds())/1e3)
		}
	}
	if err := pp.Close(); err != nil {
		return Record{}, err
	}
	r := Record{
		Kind: KindLatency, Path: PathTCP, Mode: ModePull, Size: size, Concurrency: 1, Baseline: BasePingPong,
		P50us: quantile(path, 0.5), P99us: quantile(path, 0.99),
		BaselineP50us: quantile(base, 0.5), BaselineP99us: quantile(base, 0.99),
		Rounds: n, PeakRSS: PeakRSS(),
	}
	r.GBps = float64(size) / (r.P50us * 1e3)
	r.BaselineGBps = float64(size) / (r.BaselineP50us * 1e3)
	r.Ratio = r.BaselineP50us / r.P50us
	return r, nil
}

func median(xs []float64) float64 { return quantile(xs, 0.5) }

// quantile is the nearest-rank q-quantile of xs (which it sorts a copy of).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(len(s)-1, i))]
}

// PeakRSS returns the process's peak resident set size in bytes (VmHWM in
// /proc/self/status), or 0 where that is not available.
func PeakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err == nil {
					return kb << 10
				}
			}
		}
	}
	return 0
}
