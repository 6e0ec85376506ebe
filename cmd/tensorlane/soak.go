package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/stack"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

type soakOptions struct {
	duration    time.Duration
	runtimes    int
	concurrency int
	maxSize     string
	faultEvery  time.Duration
	bound       time.Duration
	stall       time.Duration
	seed        uint64
	json        bool
	verbose     bool
}

func init() {
	o := soakOptions{}
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "Random verified transfers between runtimes while injecting faults",
		Long: `soak runs several runtimes in this process (simulated dgx-h100 hosts talking over
loopback) and moves random tensors between them for --duration (one in eight a broadcast
to slots two to four readers reserved), checking every byte,
while a fault injector kills and restarts runtimes (same identity and addresses, so old
refs meet a new incarnation), cuts data connections, blackholes and delays them (through
TCP proxies the readers are routed over) and presents forged refs.

It prints transfers, faults_injected, errors_surfaced, hung, bytes_corrupted and
leaked_bytes (plus details). A call is hung when it did not return within its bound
(--bound plus a grace period); leaked_bytes is device memory still in use at the end,
after every object was freed. Exits non-zero if hung, bytes_corrupted, leaked_bytes,
untyped_errors or forged_accepted is not zero.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := runSoak(cmd.Context(), o)
			if err != nil {
				return err
			}
			if o.json {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(res); err != nil {
					return err
				}
			} else {
				printSoak(cmd.OutOrStdout(), res)
			}
			if !res.OK {
				return fmt.Errorf("soak failed: hung %d, bytes_corrupted %d, leaked_bytes %d, untyped_errors %d, forged_accepted %d",
					res.Hung, res.BytesCorrupted, res.LeakedBytes, res.UntypedErrors, res.ForgedAccepted)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.duration, "duration", time.Minute, "how long to run")
	f.IntVar(&o.runtimes, "runtimes", 3, "runtimes (simulated hosts) in the soak")
	f.IntVar(&o.concurrency, "concurrency", 4, "transfers in flight at once")
	f.StringVar(&o.maxSize, "max-size", "8MiB", "largest tensor moved")
	f.DurationVar(&o.faultEvery, "fault-every", 300*time.Millisecond, "mean interval between injected faults")
	f.DurationVar(&o.bound, "bound", 10*time.Second, "deadline of every transfer; a call still running after bound+grace counts as hung")
	f.DurationVar(&o.stall, "stall-timeout", 2*time.Second, "runtimes' stall detector")
	f.Uint64Var(&o.seed, "seed", 0, "random seed (0: from the clock; printed in the result)")
	f.BoolVar(&o.json, "json", false, "print the result as JSON")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "log runtime events to stderr")
	rootCmd.AddCommand(cmd)
}

// soakResult is what soak prints. The first six fields are the contract; the
// rest explain them.
type soakResult struct {
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
	Errors           map[string]int64 `json:"errors"` // by code (see errorCode)
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
	o       soakOptions
	grace   time.Duration // slack over the bound before a call counts as hung
	cluster *topology.Cluster
	log     *slog.Logger
	maxSize int64
	slots   []*soakSlot

	transfers, faults, surfaced, hung, corrupted, attempts, moved, untyped, forgedOK atomic.Int64
	bcastFaults                                                                      atomic.Int64 // broadcasts that ran with both their faults (soak_broadcast.go)

	mu             sync.Mutex
	faultKinds     map[string]int64
	errCodes       map[string]int64
	paths          map[string]int64
	outcomes       map[string]int64
	untypedSamples []string
	maxCall        time.Duration
	maxKill        time.Duration
}

func runSoak(ctx context.Context, o soakOptions) (*soakResult, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if o.runtimes < 2 || o.concurrency < 1 || o.duration <= 0 || o.bound <= 0 || o.faultEvery <= 0 {
		return nil, fmt.Errorf("soak: need --runtimes >= 2, --concurrency >= 1 and positive --duration, --bound, --fault-every")
	}
	maxSize, err := parseSize(o.maxSize)
	if err != nil {
		return nil, err
	}
	if o.seed == 0 {
		o.seed = uint64(time.Now().UnixNano())
	}
	cluster, err := topology.Preset("dgx-h100", o.runtimes)
	if err != nil {
		return nil, err
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if o.verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	s := &soak{o: o, grace: 5 * time.Second, cluster: cluster, log: logger, maxSize: maxSize,
		faultKinds: map[string]int64{}, errCodes: map[string]int64{}, paths: map[string]int64{}, outcomes: map[string]int64{}}
	res := &soakResult{Seed: o.seed, GoroutinesBefore: runtime.NumGoroutine()}
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

	runCtx, stop := context.WithTimeout(ctx, o.duration)
	defer stop()
	var wg sync.WaitGroup
	for i := 0; i < o.concurrency; i++ {
		rng := rand.New(rand.NewPCG(o.seed, uint64(i)+1))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				if rng.IntN(8) == 0 { // soak_broadcast.go
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
		s.injectFaults(runCtx, rand.New(rand.NewPCG(o.seed, 0)))
	}()
	wg.Wait()

	// Everything stopped: heal the links, free what is left and take stock.
	for _, sl := range s.slots {
		sl.links.heal()
	}
	// Memory still in use is a leak unless it comes back within a bound:
	// a broadcast cut short by the end of the run winds its relays down
	// (and unpins their slots) just after (soak_broadcast.go).
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
		DeviceMemory: 256 << 20, TransferTimeout: s.o.bound, StallTimeout: s.o.stall, Logger: s.log, IgnoreEnv: true,
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
	grace := s.o.bound + s.grace + 2*s.o.stall
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
	code := errorCode(err)
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
		gctx, cancel := context.WithTimeout(ctx, s.o.bound)
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
	fillPattern(p, seed)
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
		ctx, cancel := context.WithTimeout(context.Background(), s.o.bound)
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
	first := checkPattern(p, seed)
	if first < 0 {
		return 0
	}
	var bad int64
	var want [8]byte
	for off := first &^ 7; off < len(p); off += 8 {
		binary.LittleEndian.PutUint64(want[:], patternWord(seed, off))
		for i := 0; i < 8 && off+i < len(p); i++ {
			w := want[i]
			if off+i >= len(p)&^7 { // the tail bytes fillPattern writes one by one
				w = byte(patternWord(seed, off+i))
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
		wait := time.Duration(rng.Int64N(int64(2*s.o.faultEvery)) + 1)
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
			sl.links.blackhole(time.Duration(rng.Int64N(int64(3 * s.o.stall))))
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
func (r *soakResult) Unaccounted() int64 {
	n := r.Attempts
	for _, v := range r.Outcomes {
		n -= v
	}
	return n
}

func printSoak(w io.Writer, r *soakResult) {
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

// faultLinks are the fault proxies in front of one runtime's data
// services: its tcp server and each of its rdma rails.
type faultLinks struct {
	mu    sync.Mutex
	tcp   *faultProxy
	rails map[string]*faultProxy // by NIC
}

// target points the proxies at the runtime's current addresses, creating
// them on first use.
func (l *faultLinks) target(addrs map[string]string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	set := func(p **faultProxy, addr string) error {
		if *p == nil {
			np, err := newFaultProxy(addr)
			if err != nil {
				return err
			}
			*p = np
			return nil
		}
		(*p).setTarget(addr)
		return nil
	}
	if err := set(&l.tcp, addrs[fabric.TCP]); err != nil {
		return err
	}
	if a := addrs[fabric.RDMA]; a != "" {
		rails, err := rdma.ParseAddrs(a)
		if err != nil {
			return err
		}
		for _, r := range rails {
			p := l.rails[r.NIC]
			if err := set(&p, r.Addr); err != nil {
				return err
			}
			l.rails[r.NIC] = p
		}
	}
	return nil
}

// route rewrites a ref's data addresses to go through the proxies.
func (l *faultLinks) route(addrs map[string]string) map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]string{fabric.TCP: l.tcp.Addr()}
	if rails, err := rdma.ParseAddrs(addrs[fabric.RDMA]); err == nil {
		for i, r := range rails {
			if p := l.rails[r.NIC]; p != nil {
				rails[i].Addr = p.Addr()
			}
		}
		out[fabric.RDMA] = rdma.FormatAddrs(rails)
	}
	return out
}

func (l *faultLinks) each(f func(*faultProxy)) {
	l.mu.Lock()
	ps := []*faultProxy{l.tcp}
	for _, p := range l.rails {
		ps = append(ps, p)
	}
	l.mu.Unlock()
	for _, p := range ps {
		if p != nil {
			f(p)
		}
	}
}

func (l *faultLinks) cut()                      { l.each((*faultProxy).cut) }
func (l *faultLinks) heal()                     { l.each((*faultProxy).heal) }
func (l *faultLinks) blackhole(d time.Duration) { l.each(func(p *faultProxy) { p.blackhole(d) }) }
func (l *faultLinks) delay(by, d time.Duration) { l.each(func(p *faultProxy) { p.delay(by, d) }) }
func (l *faultLinks) Close()                    { l.each(func(p *faultProxy) { p.Close() }) }

// faultProxy forwards TCP connections to a runtime's data address and
// injects link faults on command: cut (close every connection now),
// blackhole (stop forwarding without closing, for a while) and delay
// (hold each forwarded chunk back). Readers reach it through a rewritten
// ref; peerauth runs end to end through it, so it cannot read or forge.
type faultProxy struct {
	ln net.Listener
	wg sync.WaitGroup

	mu        sync.Mutex
	target    string
	conns     map[net.Conn]struct{}
	closed    bool
	holdUntil time.Time // blackhole
	delayBy   time.Duration
	delayTill time.Time
	healed    chan struct{} // closed and replaced when a blackhole ends early
}

func newFaultProxy(target string) (*faultProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &faultProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, healed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *faultProxy) Addr() string { return p.ln.Addr().String() }

func (p *faultProxy) setTarget(t string) {
	p.mu.Lock()
	p.target = t
	p.mu.Unlock()
}

func (p *faultProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *faultProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			p.mu.Lock()
			target := p.target
			p.mu.Unlock()
			up, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				return
			}
			if !p.track(up) {
				return
			}
			defer p.untrack(up)
			var pw sync.WaitGroup
			pw.Add(2)
			go func() { defer pw.Done(); p.pump(up, c) }()
			go func() { defer pw.Done(); p.pump(c, up) }()
			pw.Wait()
		}()
	}
}

// pump copies src to dst, applying the current faults to every chunk; it
// closes both when either side ends.
func (p *faultProxy) pump(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.hold(src) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// hold applies a blackhole or delay before a chunk goes on; false means the
// connection was cut or the proxy closed meanwhile.
func (p *faultProxy) hold(c net.Conn) bool {
	for {
		p.mu.Lock()
		_, live := p.conns[c]
		if p.closed || !live {
			p.mu.Unlock()
			return false
		}
		now := time.Now()
		wait, blackholed := p.holdUntil.Sub(now), true
		if wait <= 0 {
			wait, blackholed = 0, false
			if now.Before(p.delayTill) {
				wait = p.delayBy
			}
		}
		healed := p.healed
		p.mu.Unlock()
		if wait <= 0 {
			return true
		}
		// Wait in slices so that a cut during a blackhole is noticed.
		t := time.NewTimer(min(wait, 100*time.Millisecond))
		select {
		case <-t.C:
		case <-healed:
			t.Stop()
		}
		if !blackholed {
			return true
		}
	}
}

func (p *faultProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c) // pumps waiting in a blackhole see the cut
	}
}

func (p *faultProxy) blackhole(d time.Duration) {
	p.mu.Lock()
	p.holdUntil = time.Now().Add(d)
	p.mu.Unlock()
}

func (p *faultProxy) delay(by, d time.Duration) {
	p.mu.Lock()
	p.delayBy, p.delayTill = by, time.Now().Add(d)
	p.mu.Unlock()
}

// heal ends every fault at once.
func (p *faultProxy) heal() {
	p.mu.Lock()
	p.holdUntil, p.delayTill = time.Time{}, time.Time{}
	close(p.healed)
	p.healed = make(chan struct{})
	p.mu.Unlock()
}

// Close stops the proxy and waits for its goroutines. It is idempotent.
func (p *faultProxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}
