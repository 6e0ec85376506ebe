package soak

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/tensorlane/tensorlane/cmd/internal/worker"
	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/stack"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Config is one soak run. Its zero value means the defaults documented on
// each field (the same as the command's flags).
type Config struct {
	Duration    time.Duration // how long to run (default 1 min)
	Runtimes    int           // runtimes, each a simulated host (default 3; at least 2)
	Concurrency int           // transfers in flight at once (default 4)
	MaxSize     int64         // largest tensor moved, in bytes (default 8 MiB)
	FaultEvery  time.Duration // mean interval between injected faults (default 300 ms)
	// Bound is every transfer's deadline; a call still running after
	// Bound plus a grace period counts as hung (default 10 s).
	Bound   time.Duration
	Stall   time.Duration // the runtimes' stall detector (default 2 s)
	Seed    uint64        // random seed (0: from the clock; reported in the Result)
	Verbose bool          // log runtime events to stderr
}

// withDefaults fills in the documented defaults of the zero fields.
func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.Duration, time.Minute)
	def(&c.FaultEvery, 300*time.Millisecond)
	def(&c.Bound, 10*time.Second)
	def(&c.Stall, 2*time.Second)
	if c.Runtimes == 0 {
		c.Runtimes = 3
	}
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
	if c.MaxSize == 0 {
		c.MaxSize = 8 << 20
	}
	return c
}

// ErrBadConfig is what Run returns for a Config it cannot run.
var ErrBadConfig = errors.New("soak: bad config")

// Result is what a soak run reports. The first six fields are the
// contract; the rest explain them.
type Result struct {
	Transfers      int64 `json:"transfers"` // completed and verified byte for byte
	FaultsInjected int64 `json:"faults_injected"`
	ErrorsSurfaced int64 `json:"errors_surfaced"` // calls that returned a typed error
	Hung           int64 `json:"hung"`
	BytesCorrupted int64 `json:"bytes_corrupted"`
	LeakedBytes    int64 `json:"leaked_bytes"`

	OK       bool    `json:"ok"`
	Seed     uint64  `json:"seed"`
	Seconds  float64 `json:"seconds"`
	Attempts int64   `json:"attempts"`
	// Outcomes accounts for every attempt, exactly once: "transferred",
	// "error" (typed), "error_untyped", "corrupted", "hung", or
	// "skipped:<reason>". They sum to Attempts.
	Outcomes         map[string]int64 `json:"outcomes"`
	BytesMoved       int64            `json:"bytes_moved"`
	Faults           map[string]int64 `json:"faults"`
	Errors           map[string]int64 `json:"errors"` // by code (see worker.ErrorCode)
	Paths            map[string]int64 `json:"paths"`
	UntypedErrors    int64            `json:"untyped_errors"`
	UntypedSamples   []string         `json:"untyped_samples,omitempty"`
	ForgedAccepted   int64            `json:"forged_accepted"` // a forged ref that read data: must be 0
	LeakedObjects    int              `json:"leaked_objects"`
	MaxCallSeconds   float64          `json:"max_call_seconds"`
	MaxKillSeconds   float64          `json:"max_kill_seconds"` // abrupt shutdown + restart
	GoroutinesBefore int              `json:"goroutines_before"`
	GoroutinesAfter  int              `json:"goroutines_after"`
}

// soakSlot is one simulated host: a runtime that the fault injector may kill
// and restart under the same identity and addresses.
type soakSlot struct {
	host   string
	key    crypto.PrivKey
	listen string            // control multiaddr, fixed after the first start
	data   string            // tcp data address, fixed after the first start
	rails  map[string]string // rdma NIC -> rail address, fixed after the first start
	links  *faultLinks

	// mu is held for reading while the soak itself touches this runtime's
	// memory (filling a put, checking a fetched copy, free), and for writing
	// while it is killed and restarted: Shutdown unmaps the arenas, and a
	// caller must not hold a tensor across it. Fetches run without it, so
	// a reader can be killed mid-transfer.
	mu    sync.RWMutex
	rt    *rdt.Runtime
	actor *rdt.Actor
	gen   int
}

type soak struct {
	o       Config
	grace   time.Duration // slack over the bound before a call counts as hung
	cluster *topology.Cluster
	log     *slog.Logger
	maxSize int64
	slots   []*soakSlot

	transfers, faults, surfaced, hung, corrupted, attempts, moved, untyped, forgedOK atomic.Int64
	bcastFaults                                                                      atomic.Int64 // broadcasts that ran with both their faults (broadcast.go)

	mu             sync.Mutex
	faultKinds     map[string]int64
	errCodes       map[string]int64
	paths          map[string]int64
	outcomes       map[string]int64
	untypedSamples []string
	maxCall        time.Duration
	maxKill        time.Duration
}

// Run runs one soak and reports what happened. It returns an error only
// when the soak could not start (bad config, a runtime that would not
// come up); what went wrong during the run is in the Result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	o := cfg.withDefaults()
	if o.Runtimes < 2 || o.Concurrency < 1 || o.Duration <= 0 || o.Bound <= 0 || o.FaultEvery <= 0 || o.MaxSize < 8 {
		return nil, fmt.Errorf("%w: need Runtimes >= 2, Concurrency >= 1, MaxSize >= 8 and positive Duration, Bound, FaultEvery (or zero for the defaults)", ErrBadConfig)
	}
	maxSize := o.MaxSize
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	cluster, err := topology.Preset("dgx-h100", o.Runtimes)
	if err != nil {
		return nil, err
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if o.Verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	s := &soak{o: o, grace: 5 * time.Second, cluster: cluster, log: logger, maxSize: maxSize,
		faultKinds: map[string]int64{}, errCodes: map[string]int64{}, paths: map[string]int64{}, outcomes: map[string]int64{}}
	res := &Result{Seed: o.Seed, GoroutinesBefore: runtime.NumGoroutine()}
	start := time.Now()

	defer s.closeAll()
	for _, h := range cluster.Hosts {
		key, _, err := crypto.GenerateEd25519Key(nil)
		if err != nil {
			return nil, err
		}
		sl := &soakSlot{host: h.ID, key: key, listen: "/ip4/127.0.0.1/tcp/0", data: "127.0.0.1:0", links: &faultLinks{rails: map[string]*faultProxy{}}}
		s.slots = append(s.slots, sl) // before start, so closeAll sees it
		if err := s.start(ctx, sl); err != nil {
			return nil, err
		}
	}
	for _, sl := range s.slots {
		s.connect(ctx, sl)
	}

	runCtx, stop := context.WithTimeout(ctx, o.Duration)
	defer stop()
	var wg sync.WaitGroup
	for i := 0; i < o.Concurrency; i++ {
		rng := rand.New(rand.NewPCG(o.Seed, uint64(i)+1))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				if rng.IntN(8) == 0 { // broadcast.go
					s.broadcast(runCtx, rng)
					continue
				}
				s.transfer(runCtx, rng)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.injectFaults(runCtx, rand.New(rand.NewPCG(o.Seed, 0)))
	}()
	wg.Wait()

	// Everything stopped: heal the links, free what is left and take stock.
	for _, sl := range s.slots {
		sl.links.heal()
	}
	// Memory still in use is a leak unless it comes back within a bound:
	// a broadcast cut short by the end of the run winds its relays down
	// (and unpins their slots) just after (broadcast.go).
	settle := time.Now().Add(3 * time.Second)
	for {
		res.LeakedBytes, res.LeakedObjects = 0, 0
		for _, sl := range s.slots {
			sl.mu.Lock()
			for _, d := range sl.rt.Devices() {
				m, _ := sl.rt.Memory(d)
				res.LeakedBytes += m.Stats().Used
			}
			res.LeakedObjects += sl.rt.Objects()
			sl.mu.Unlock()
		}
		if res.LeakedBytes == 0 && res.LeakedObjects == 0 || time.Now().After(settle) {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling for memory to come back, not waiting for work
	}
	s.closeAll()
	res.GoroutinesAfter = settleGoroutines(res.GoroutinesBefore, 3*time.Second)

	res.Transfers, res.FaultsInjected, res.ErrorsSurfaced = s.transfers.Load(), s.faults.Load(), s.surfaced.Load()
	res.Hung, res.BytesCorrupted = s.hung.Load(), s.corrupted.Load()
	res.Attempts, res.BytesMoved, res.UntypedErrors, res.ForgedAccepted = s.attempts.Load(), s.moved.Load(), s.untyped.Load(), s.forgedOK.Load()
	s.mu.Lock()
	res.Faults, res.Errors, res.Paths, res.UntypedSamples = s.faultKinds, s.errCodes, s.paths, s.untypedSamples
	res.Outcomes = s.outcomes
	res.MaxCallSeconds, res.MaxKillSeconds = s.maxCall.Seconds(), s.maxKill.Seconds()
	s.mu.Unlock()
	res.Seconds = time.Since(start).Seconds()
	res.OK = res.Hung == 0 && res.BytesCorrupted == 0 && res.LeakedBytes == 0 && res.LeakedObjects == 0 &&
		res.UntypedErrors == 0 && res.ForgedAccepted == 0 && res.Unaccounted() == 0
	return res, nil
}

// settleGoroutines waits a little for goroutines of closed runtimes to
// finish and returns the count.
func settleGoroutines(before int, wait time.Duration) int {
	deadline := time.Now().Add(wait)
	for {
		n := runtime.NumGoroutine()
		if n <= before || time.Now().After(deadline) {
			return n
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// start creates the slot's runtime. After the first start it reuses the
// same control and data addresses, so that refs from the previous life
// reach the new incarnation and must be refused as stale.
func (s *soak) start(ctx context.Context, sl *soakSlot) error {
	cfg := rdt.Config{
		RuntimeDir: rdt.ProcessRuntimeDir(), // every simulated host lives in this process
		Cluster:    s.cluster, Host: sl.host, Identity: sl.key, ListenAddrs: []string{sl.listen},
		Transports:   stack.Config{DataAddr: sl.data, RDMAAddrs: sl.rails},
		DeviceMemory: 256 << 20, TransferTimeout: s.o.Bound, StallTimeout: s.o.Stall, Logger: s.log, IgnoreEnv: true,
	}
	rt, err := rdt.New(ctx, cfg)
	if err != nil && sl.gen > 0 {
		// The old port can be taken in between; a fresh one still restarts
		// the host, only old refs then fail to connect rather than as stale.
		s.log.Warn("restart on the old addresses failed; using fresh ones", "host", sl.host, "err", err)
		s.count(&s.faultKinds, "restart_on_new_port")
		cfg.ListenAddrs, cfg.Transports.DataAddr, cfg.Transports.RDMAAddrs = []string{"/ip4/127.0.0.1/tcp/0"}, "127.0.0.1:0", nil
		rt, err = rdt.New(ctx, cfg)
	}
	if err != nil {
		return err
	}
	actor, err := rt.Spawn("soak")
	if err != nil {
		rt.Shutdown(ctx)
		return err
	}
	addrs, err := dataAddrsOf(ctx, rt, actor)
	if err == nil {
		err = sl.links.target(addrs)
	}
	if err != nil {
		rt.Shutdown(ctx)
		return err
	}
	sl.rt, sl.actor, sl.data = rt, actor, addrs[fabric.TCP]
	if rails, err := rdma.ParseAddrs(addrs[fabric.RDMA]); err == nil {
		sl.rails = map[string]string{}
		for _, r := range rails {
			sl.rails[r.NIC] = r.Addr
		}
	}
	if a := rt.AddrInfo().Addrs; len(a) > 0 {
		sl.listen = a[0].String()
	}
	sl.gen++
	return nil
}

// dataAddrsOf learns the runtime's data addresses (tcp, rdma rails) from a
// ref, the only place rdt publishes them.
func dataAddrsOf(ctx context.Context, rt *rdt.Runtime, a *rdt.Actor) (map[string]string, error) {
	mem, err := rt.Memory(tensor.HostDevice)
	if err != nil {
		return nil, err
	}
	t, err := tensor.Alloc(ctx, mem, tensor.Uint8, 8)
	if err != nil {
		return nil, err
	}
	ref, err := a.Put(ctx, t)
	if err != nil {
		t.Release()
		return nil, err
	}
	defer a.Free(ctx, ref)
	if ref.DataAddrs[fabric.TCP] == "" {
		return nil, errors.New("soak: runtime publishes no tcp data address")
	}
	return ref.DataAddrs, nil
}

func (s *soak) connect(ctx context.Context, sl *soakSlot) {
	for _, other := range s.slots {
		if other == sl {
			continue
		}
		other.mu.RLock()
		info := other.rt.AddrInfo()
		other.mu.RUnlock()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := sl.rt.Connect(cctx, info); err != nil {
			s.log.Warn("connect", "from", sl.host, "to", other.host, "err", err)
		}
		cancel()
	}
}

func (s *soak) closeAll() {
	for _, sl := range s.slots {
		sl.mu.Lock()
		if sl.rt != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			sl.rt.Shutdown(ctx)
			cancel()
		}
		sl.mu.Unlock()
		sl.links.Close()
	}
}

func (s *soak) count(m *map[string]int64, key string) {
	s.mu.Lock()
	(*m)[key]++
	s.mu.Unlock()
}

// bounded runs fn and counts it as hung when it has not returned by the
// soak's bound plus a grace period (the runtime must enforce the bound
// itself; the grace covers a loaded machine).
func (s *soak) bounded(what string, fn func()) {
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		fn()
	}()
	grace := s.o.Bound + s.grace + 2*s.o.Stall
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.hung.Add(1)
		s.count(&s.errCodes, "hung:"+what)
		s.log.Error("call did not return within its bound", "call", what, "bound", grace)
		// Give it one more bound to come back; a call that never does is
		// abandoned (and its goroutine with it) so the soak still reports.
		late := time.NewTimer(grace)
		defer late.Stop()
		select {
		case <-done:
		case <-late.C:
			s.log.Error("abandoning a hung call", "call", what)
		}
	}
	d := time.Since(start)
	s.mu.Lock()
	if what == "kill" {
		s.maxKill = max(s.maxKill, d)
	} else {
		s.maxCall = max(s.maxCall, d)
	}
	s.mu.Unlock()
}

// surfaced records an error a call returned: typed (the contract) or not.
// surface counts an error a call returned and reports whether it was typed.
func (s *soak) surface(op string, err error) bool {
	code := worker.ErrorCode(err)
	s.surfaced.Add(1)
	s.count(&s.errCodes, op+":"+code)
	if code == "other" {
		s.untyped.Add(1)
		s.mu.Lock()
		if len(s.untypedSamples) < 8 {
			s.untypedSamples = append(s.untypedSamples, op+": "+err.Error())
		}
		s.mu.Unlock()
		return false
	}
	return true
}

// transfer puts a random tensor on a random owner, reads it from a random
// reader (directly, through the owner's fault proxy, or with a forged ref),
// verifies every byte and frees it.
func (s *soak) transfer(ctx context.Context, rng *rand.Rand) {
	owner := s.slots[rng.IntN(len(s.slots))]
	reader := owner
	if rng.IntN(10) < 8 { // mostly across hosts (tcp), sometimes on one (p2p, local)
		reader = s.slots[rng.IntN(len(s.slots))]
	}
	size := int64(8) << rng.IntN(64-clz(s.maxSize/8))
	size = min(s.maxSize, size+8*rng.Int64N(size/8+1))
	seed := rng.Uint64()
	ownerDev := tensor.GPUDevice(rng.IntN(4))
	readerDev := tensor.GPUDevice(rng.IntN(4))

	var ref rdt.Ref
	var putErr error
	s.bounded("put", func() {
		owner.mu.RLock()
		defer owner.mu.RUnlock()
		ref, putErr = soakPut(ctx, owner, ownerDev, size, seed)
	})
	if putErr != nil {
		if ctx.Err() == nil {
			s.surface("put", putErr)
		}
		return
	}
	defer s.free(owner, ref)

	forged := ""
	switch k := rng.IntN(20); {
	case k == 0:
		forged = "token"
		ref.Token = append([]byte(nil), ref.Token...)
		ref.Token[rng.IntN(len(ref.Token))] ^= 1 << rng.IntN(8)
	case k == 1:
		forged = "incarnation"
		ref.Incarnation ^= 2
	case k < 12:
		// through the owner's proxy, where cuts, blackholes and delays hit
		ref.DataAddrs = owner.links.route(ref.DataAddrs)
	}
	if rng.IntN(3) == 0 {
		// Without its rdma rails the ref is read over tcp, so both network
		// paths meet the faults.
		addrs := maps.Clone(ref.DataAddrs)
		delete(addrs, fabric.RDMA)
		ref.DataAddrs = addrs
	}
	if forged != "" {
		s.faults.Add(1)
		s.count(&s.faultKinds, "forged_"+forged)
	}

	s.attempts.Add(1)
	// Every attempt ends in exactly one outcome: its own, or "hung" when
	// the call was abandoned without coming back.
	var once sync.Once
	outcome := func(o string) { once.Do(func() { s.count(&s.outcomes, o) }) }
	defer outcome("hung") // reached first only if the call never came back
	s.bounded("get", func() {
		// The reader may be killed while the Fetch is in flight: rdt must
		// abort it and release the destination before its arenas go.
		reader.mu.RLock()
		actor := reader.actor
		reader.mu.RUnlock()
		gctx, cancel := context.WithTimeout(ctx, s.o.Bound)
		defer cancel()
		t, xfer, err := actor.Fetch(gctx, ref, readerDev)
		if err != nil {
			if ctx.Err() != nil {
				outcome("skipped:soak_ended")
				return
			}
			if s.surface("get", err) {
				outcome("error")
			} else {
				outcome("error_untyped")
			}
			return
		}
		defer t.Release()
		// Reading the result needs the arena mapped: hold off kills, and
		// skip a result whose runtime was killed since (its arena is gone).
		reader.mu.RLock()
		defer reader.mu.RUnlock()
		if reader.actor != actor {
			s.count(&s.errCodes, "get:reader_killed_after_success")
			outcome("skipped:reader_killed_after_success")
			return
		}
		if forged != "" {
			s.forgedOK.Add(1)
			s.log.Error("a forged ref was served", "forged", forged, "ref", ref)
		}
		p, err := t.SpanBytes()
		if err != nil {
			if s.surface("get", err) {
				outcome("error")
			} else {
				outcome("error_untyped")
			}
			return
		}
		if bad := countMismatches(p, seed); bad > 0 {
			outcome("corrupted")
			s.corrupted.Add(bad)
			s.log.Error("transfer delivered wrong bytes", "ref", ref, "bad", bad, "path", xfer.Stats.Transport)
			return
		}
		outcome("transferred")
		s.transfers.Add(1)
		s.moved.Add(int64(len(p)))
		s.count(&s.paths, xfer.Stats.Transport)
	})
}

func clz(n int64) int {
	bits := 0
	for ; n > 0; n >>= 1 {
		bits++
	}
	return 64 - bits
}

func soakPut(ctx context.Context, sl *soakSlot, dev tensor.DeviceID, size int64, seed uint64) (rdt.Ref, error) {
	mem, err := sl.rt.Memory(dev)
	if err != nil {
		return rdt.Ref{}, err
	}
	t, err := tensor.Alloc(ctx, mem, tensor.Uint8, size)
	if err != nil {
		return rdt.Ref{}, err
	}
	p, err := t.SpanBytes()
	if err != nil {
		t.Release()
		return rdt.Ref{}, err
	}
	worker.FillPattern(p, seed)
	ref, err := sl.actor.Put(ctx, t)
	if err != nil {
		t.Release()
	}
	return ref, err
}

// free releases the object on its owner. An owner killed since the put
// took the object with it (its incarnation no longer matches).
func (s *soak) free(sl *soakSlot, ref rdt.Ref) {
	s.bounded("free", func() {
		sl.mu.RLock()
		defer sl.mu.RUnlock()
		ctx, cancel := context.WithTimeout(context.Background(), s.o.Bound)
		defer cancel()
		err := sl.actor.Free(ctx, ref)
		switch {
		case err == nil, errors.Is(err, rdt.ErrNotOwner), errors.Is(err, rdt.ErrClosed):
		default:
			s.surface("free", err)
		}
	})
}

// countMismatches counts the bytes of p that differ from the pattern of
// seed.
func countMismatches(p []byte, seed uint64) int64 {
	first := worker.CheckPattern(p, seed)
	if first < 0 {
		return 0
	}
	var bad int64
	var want [8]byte
	for off := first &^ 7; off < len(p); off += 8 {
		binary.LittleEndian.PutUint64(want[:], worker.PatternWord(seed, off))
		for i := 0; i < 8 && off+i < len(p); i++ {
			w := want[i]
			if off+i >= len(p)&^7 { // the tail bytes worker.FillPattern writes one by one
				w = byte(worker.PatternWord(seed, off+i))
			}
			if p[off+i] != w {
				bad++
			}
		}
	}
	return bad
}

// injectFaults injects one fault at a time at random intervals until ctx
// ends.
func (s *soak) injectFaults(ctx context.Context, rng *rand.Rand) {
	for {
		wait := time.Duration(rng.Int64N(int64(2*s.o.FaultEvery)) + 1)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		sl := s.slots[rng.IntN(len(s.slots))]
		var kind string
		switch k := rng.IntN(10); {
		case k < 2:
			kind = "kill"
			s.bounded("kill", func() { s.kill(ctx, sl) })
		case k < 5:
			kind = "cut"
			sl.links.cut()
		case k < 7:
			kind = "blackhole"
			sl.links.blackhole(time.Duration(rng.Int64N(int64(3 * s.o.Stall))))
		default:
			kind = "delay"
			sl.links.delay(time.Duration(rng.Int64N(int64(20*time.Millisecond))), time.Second)
		}
		s.faults.Add(1)
		s.count(&s.faultKinds, kind)
	}
}

// kill shuts a runtime down abruptly (transfers in flight from it are cut)
// and restarts it under the same identity and addresses.
func (s *soak) kill(ctx context.Context, sl *soakSlot) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	// An expired context makes Shutdown abrupt: transfers in flight are
	// aborted at once rather than finished.
	sctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sl.rt.Shutdown(sctx); err != nil {
		s.log.Warn("shutdown of killed runtime", "host", sl.host, "err", err)
	}
	cancel()
	// Restart even when the soak is ending, so every slot has a live
	// runtime to account for at the end.
	if err := s.start(context.Background(), sl); err != nil {
		s.log.Error("restart failed", "host", sl.host, "err", err)
		s.count(&s.errCodes, "restart_failed")
		s.untyped.Add(1) // a slot without a runtime cannot be accounted for
		return
	}
	s.connect(ctx, sl) // takes the other slots' locks; only this goroutine takes write locks
}

// Unaccounted is how many attempts have no outcome: must be 0.
func (r *Result) Unaccounted() int64 {
	n := r.Attempts
	for _, v := range r.Outcomes {
		n -= v
	}
	return n
}

// Print writes r as the soak command shows it.
func Print(w io.Writer, r *Result) {
	fmt.Fprintf(w, "tensorlane soak: %.1f s, seed %d (simulated hosts in one process, loopback)\n", r.Seconds, r.Seed)
	fmt.Fprintf(w, "transfers %d verified of %d attempts (%d bytes), faults injected %d, errors surfaced %d\n",
		r.Transfers, r.Attempts, r.BytesMoved, r.FaultsInjected, r.ErrorsSurfaced)
	fmt.Fprintf(w, "hung %d, bytes corrupted %d, leaked bytes %d (objects %d), untyped errors %d, forged refs accepted %d\n",
		r.Hung, r.BytesCorrupted, r.LeakedBytes, r.LeakedObjects, r.UntypedErrors, r.ForgedAccepted)
	for _, m := range []struct {
		name string
		m    map[string]int64
	}{{"attempts", r.Outcomes}, {"faults", r.Faults}, {"errors", r.Errors}, {"paths", r.Paths}} {
		keys := make([]string, 0, len(m.m))
		for k := range m.m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(w, "%s:", m.name)
		for _, k := range keys {
			fmt.Fprintf(w, " %s=%d", k, m.m[k])
		}
		fmt.Fprintln(w)
	}
	for _, u := range r.UntypedSamples {
		fmt.Fprintln(w, "untyped:", u)
	}
	if n := r.Unaccounted(); n != 0 {
		fmt.Fprintf(w, "UNACCOUNTED attempts: %d (every attempt must end as a transfer, a typed error or a named skip)\n", n)
	}
	fmt.Fprintf(w, "longest call %.2f s, longest kill+restart %.2f s; ok=%v\n", r.MaxCallSeconds, r.MaxKillSeconds, r.OK)
}
