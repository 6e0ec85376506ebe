package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/bench"
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

// Run measures the matrix cfg selects on a simulated cluster of two
// dgx-h100 hosts built in this process (one rdt runtime per host, talking
// over loopback): local is a Get on the owner's own GPU, p2p a Get onto an
// NVLink-linked GPU of the same host, tcp a Get from the other host. Every
// runtime, socket and goroutine it starts is closed before it returns.
func Run(ctx context.Context, cfg Config) (res Result, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return res, err
	}
	start := time.Now()
	res.Quick = cfg.Quick
	env, err := newEnv(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer func() {
		if cerr := env.close(); err == nil {
			err = cerr
		}
	}()

	total := 0
	for range cfg.Sizes {
		total += len(cfg.Paths) * len(cfg.Concurrency)
	}
	if !cfg.NoLatency && slices.Contains(cfg.Paths, PathTCP) {
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
	for _, size := range cfg.Sizes {
		sz, err := env.prepare(ctx, size)
		if err != nil {
			return res, err
		}
		for _, path := range cfg.Paths {
			for _, c := range cfg.Concurrency {
				if int64(c)*size > cfg.MaxInFlight {
					emit(Record{Kind: KindThroughput, Path: path, Mode: ModePull, Size: size, Concurrency: c,
						Status: StatusSkipped, Note: fmt.Sprintf("%s in flight exceeds MaxInFlight %s", SizeString(int64(c)*size), SizeString(cfg.MaxInFlight))})
					continue
				}
				recs, err := sz.cell(ctx, cfg, path, c)
				if err != nil {
					sz.close()
					return res, fmt.Errorf("harness: %s %s x%d: %w", path, SizeString(size), c, err)
				}
				emit(recs...)
			}
		}
		if err := sz.close(); err != nil {
			return res, err
		}
	}
	if !cfg.NoLatency && slices.Contains(cfg.Paths, PathTCP) {
		for _, size := range cfg.LatencySizes {
			r, err := env.latency(ctx, cfg, size)
			if err != nil {
				return res, fmt.Errorf("harness: latency %s: %w", SizeString(size), err)
			}
			emit(r)
		}
	}
	res.Records = append(res.Records, NotBuilt()...)
	res.PeakRSS = PeakRSS()
	res.Elapsed = time.Since(start)
	return res, nil
}

var (
	srcDev  = tensor.GPUDevice(0)
	nearDev = tensor.GPUDevice(1) // NVLink-linked to GPU 0 in dgx-h100
)

type env struct {
	ra, rb           *rdt.Runtime
	owner, near, far *rdt.Actor
	nearMem, farMem  tensor.Memory
	ownerMem         tensor.Memory
}

func newEnv(ctx context.Context, cfg Config) (*env, error) {
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
	// Arenas are sparse memfds: the cap costs only the pages written.
	devMem := 2*maxSize + inflight + 64<<20
	e := &env{}
	if e.ra, err = rdt.New(ctx, rdt.Config{Cluster: cl, Host: "h0", IgnoreEnv: true, DeviceMemory: devMem}); err != nil {
		return nil, err
	}
	if e.rb, err = rdt.New(ctx, rdt.Config{Cluster: cl, Host: "h1", IgnoreEnv: true, DeviceMemory: devMem}); err != nil {
		e.close()
		return nil, err
	}
	if e.owner, err = e.ra.Spawn("bench-owner", rdt.WithDevices(srcDev)); err == nil {
		if e.near, err = e.ra.Spawn("bench-near", rdt.WithDevices(nearDev)); err == nil {
			e.far, err = e.rb.Spawn("bench-far", rdt.WithDevices(nearDev))
		}
	}
	if err == nil {
		if e.ownerMem, err = e.ra.Memory(srcDev); err == nil {
			if e.nearMem, err = e.ra.Memory(nearDev); err == nil {
				e.farMem, err = e.rb.Memory(nearDev)
			}
		}
	}
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
	for _, r := range []*rdt.Runtime{e.ra, e.rb} {
		if r != nil {
			if err := r.Shutdown(ctx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	e.ra, e.rb = nil, nil
	return errors.Join(errs...)
}

// put places a size-byte tensor with a known pattern on the owner's GPU.
func (e *env) put(ctx context.Context, size int64) (rdt.Ref, []byte, error) {
	x, err := tensor.Alloc(ctx, e.ownerMem, tensor.Uint8, size)
	if err != nil {
		return rdt.Ref{}, nil, err
	}
	p, err := x.SpanBytes()
	if err != nil {
		x.Release()
		return rdt.Ref{}, nil, err
	}
	for i := range p {
		p[i] = byte(i*7 + i>>8)
	}
	ref, err := e.owner.Put(ctx, x)
	if err != nil {
		x.Release()
		return rdt.Ref{}, nil, err
	}
	return ref, p, nil
}

// sized holds what the cells of one size share: the source object, its
// bytes, destinations and baseline connections, grown on demand.
type sized struct {
	e       *env
	size    int64
	ref     rdt.Ref
	src     []byte
	nearDst []tensor.Tensor
	farDst  []tensor.Tensor
	heapDst [][]byte
	raw     []*bench.TCPPair
	lp      *bench.Libp2pPair
}

func (e *env) prepare(ctx context.Context, size int64) (*sized, error) {
	ref, src, err := e.put(ctx, size)
	if err != nil {
		return nil, err
	}
	return &sized{e: e, size: size, ref: ref, src: src}, nil
}

func (s *sized) close() error {
	var errs []error
	for _, t := range append(s.nearDst, s.farDst...) {
		t.Release()
	}
	for _, p := range s.raw {
		if err := p.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.lp != nil {
		errs = append(errs, s.lp.Close())
	}
	errs = append(errs, s.e.owner.Free(context.Background(), s.ref))
	s.nearDst, s.farDst, s.raw, s.lp, s.heapDst = nil, nil, nil, nil, nil
	return errors.Join(errs...)
}

func (s *sized) grow(ctx context.Context, path string, c int) error {
	for len(s.heapDst) < c {
		b := make([]byte, s.size)
		copy(b, s.src) // fault the pages in, as the arenas' are after warm-up
		s.heapDst = append(s.heapDst, b)
	}
	dsts, mem := &s.nearDst, s.e.nearMem
	if path == PathTCP {
		dsts, mem = &s.farDst, s.e.farMem
		for len(s.raw) < c {
			p, err := bench.NewTCPPair(s.src)
			if err != nil {
				return err
			}
			s.raw = append(s.raw, p)
		}
		if s.lp == nil && c == 1 {
			p, err := bench.NewLibp2pPair(ctx, s.src)
			if err != nil {
				return err
			}
			s.lp = p
		}
	}
	if path == PathLocal {
		return nil
	}
	for len(*dsts) < c {
		t, err := tensor.Alloc(ctx, mem, tensor.Uint8, s.size)
		if err != nil {
			return err
		}
		*dsts = append(*dsts, t)
	}
	return nil
}

type op func(ctx context.Context, worker int) error

// cell measures one (path, size, concurrency) against its baselines.
func (s *sized) cell(ctx context.Context, cfg Config, path string, c int) ([]Record, error) {
	if err := s.grow(ctx, path, c); err != nil {
		return nil, err
	}
	e := s.e
	var measure op
	type base struct {
		name string
		op   op
	}
	var bases []base
	memcpy := base{BaseMemcpy, func(_ context.Context, w int) error { copy(s.heapDst[w], s.src); return nil }}
	switch path {
	case PathLocal:
		measure = func(ctx context.Context, _ int) error {
			v, err := e.owner.Get(ctx, s.ref, srcDev)
			if err != nil {
				return err
			}
			return v.Release()
		}
		bases = []base{memcpy}
	case PathP2P:
		measure = func(ctx context.Context, w int) error {
			_, err := e.near.GetInto(ctx, s.ref, s.nearDst[w])
			return err
		}
		bases = []base{memcpy}
	case PathTCP:
		measure = func(ctx context.Context, w int) error {
			_, err := e.far.GetInto(ctx, s.ref, s.farDst[w])
			return err
		}
		bases = []base{{BaseRawTCP, func(_ context.Context, w int) error { _, err := s.raw[w].Read(s.heapDst[w]); return err }}}
		if c == 1 {
			bases = append(bases, base{BaseLibp2p, func(_ context.Context, w int) error { _, err := s.lp.Read(s.heapDst[w]); return err }})
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
		if _, err := round(ctx, b.op, c, 1); err != nil {
			return nil, err
		}
	}
	var pathTotal time.Duration
	baseTotal := make([]time.Duration, len(bases))
	ratios := make([][]float64, len(bases))
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
		pt, err := round(ctx, measure, c, k)
		if err != nil {
			return nil, err
		}
		runtime.ReadMemStats(&ms)
		alloc += ms.TotalAlloc - before
		pathTotal += pt
		for i := range bases {
			b := bases[(i+rounds)%len(bases)] // rotate the order of baselines
			j := (i + rounds) % len(bases)
			bt, err := round(ctx, b.op, c, k)
			if err != nil {
				return nil, fmt.Errorf("baseline %s: %w", b.name, err)
			}
			baseTotal[j] += bt
			ratios[j] = append(ratios[j], bt.Seconds()/pt.Seconds())
		}
		rounds++
	}
	moved := float64(rounds) * float64(k) * float64(c) * float64(s.size)
	gbps := moved / pathTotal.Seconds() / 1e9
	rss := PeakRSS()
	recs := make([]Record, len(bases))
	for i, b := range bases {
		recs[i] = Record{
			Kind: KindThroughput, Path: path, Mode: ModePull, Size: s.size, Concurrency: c,
			GBps: gbps, Baseline: b.name, BaselineGBps: moved / baseTotal[i].Seconds() / 1e9,
			Ratio: median(ratios[i]), Rounds: rounds,
			AllocPerGiB: float64(alloc) / (moved / (1 << 30)), PeakRSS: rss,
		}
		if path == PathLocal {
			recs[i].Note = "zero-copy view"
		}
	}
	return recs, nil
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

// latency times single small tcp Gets, interleaved one for one with a raw
// TCP ping-pong of the same bytes.
func (e *env) latency(ctx context.Context, cfg Config, size int64) (Record, error) {
	ref, src, err := e.put(ctx, size)
	if err != nil {
		return Record{}, err
	}
	defer e.owner.Free(context.Background(), ref)
	dst, err := tensor.Alloc(ctx, e.farMem, tensor.Uint8, size)
	if err != nil {
		return Record{}, err
	}
	defer dst.Release()
	pp, err := bench.NewPingPong(src)
	if err != nil {
		return Record{}, err
	}
	buf := make([]byte, size)
	n := cfg.LatencySamples
	path := make([]float64, 0, n)
	base := make([]float64, 0, n)
	const warm = 10
	for i := 0; i < n+warm; i++ {
		if err := ctx.Err(); err != nil {
			pp.Close()
			return Record{}, err
		}
		t0 := time.Now()
		if _, err := e.far.GetInto(ctx, ref, dst); err != nil {
			pp.Close()
			return Record{}, err
		}
		d := time.Since(t0)
		bd, err := pp.Exchange(buf)
		if err != nil {
			pp.Close()
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
