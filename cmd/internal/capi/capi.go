// Package capi is the Go side of tensorlane's C ABI (cmd/libtensorlane):
// runtimes behind integer handles, configuration as JSON, memory as
// (address, length) pairs, refs as marshalled bytes, and errors as a kind
// (the names of rdt.ErrorKind, plus invalid_argument) and a message. No Go
// type crosses the boundary, so the C layer is a thin shell of conversions
// and this package is tested like any other.
//
// Memory comes in two kinds. Shareable memory (Alloc) is tensorlane's own
// memfd-backed host memory: a Put of a region inside it publishes a window
// of it with no copy, and other processes on the host map it. Any other
// memory is foreign (a numpy array, a C buffer): network paths read it in
// place, and the first same-host reader in another process makes the owner
// copy it once into shareable memory (tensor.Foreign; made in the
// background at Put, into pre-populated memory from a small pool). Explain
// says which. A same-host reader can also skip its own copy: View maps the
// object read-only into its process (view.go).
//
// Every method is safe for concurrent use.
package capi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libp2p/go-libp2p/core/peer"
	dto "github.com/prometheus/client_model/go"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/privdir"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/rdt/schema"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/nodepool"
	"github.com/tensorlane/tensorlane/topology"
)

// ErrInvalidArgument is a caller's mistake: an unknown handle, a bad
// dtype, a region that does not hold the tensor, malformed JSON.
var ErrInvalidArgument = rdt.ErrInvalidArgument

// Kinds are the error kinds the C ABI returns, in their stable numbering:
// the index is the code (0 is success, 1 "other"). They come from
// rdt.Kinds, the one table of error kinds.
var Kinds = func() []string {
	ks := rdt.Kinds()
	out := make([]string, ks[len(ks)-1].Code+1)
	out[0] = "ok"
	for _, k := range ks {
		out[k.Code] = k.Name
	}
	return out
}()

// Code returns err's kind as its number in Kinds (0 for nil).
func Code(err error) int { return rdt.KindCode(err) }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// Config (config_gen.go) is generated from rdt/schema by rdt/internal/confgen.

// EnvSlabs turns slab memory on ("1") for runtimes whose config does not
// say; EnvPoolBytes sizes its pre-faulted pool (bytes, or with a K, M or G
// suffix).
const (
	EnvSlabs     = schema.EnvSlabs
	EnvPoolBytes = schema.EnvPoolBytes
)

// getenv is os.Getenv unless the config ignores the environment.
func (c Config) getenv(name string) string {
	if c.IgnoreEnv {
		return ""
	}
	return os.Getenv(name)
}

// slabs resolves Slabs and PoolBytes against the environment.
func (c Config) slabs() (on bool, pool int64, err error) {
	if c.Slabs != nil {
		on = *c.Slabs
	} else {
		switch v := strings.ToLower(strings.TrimSpace(c.getenv(EnvSlabs))); v {
		case "", "0", "false", "off", "no":
		case "1", "true", "on", "yes":
			on = true
		default:
			return false, 0, invalid("%s=%q: want 1 or 0", EnvSlabs, v)
		}
	}
	pool = int64(c.PoolBytes)
	if pool == 0 {
		if v := strings.TrimSpace(c.getenv(EnvPoolBytes)); v != "" {
			if pool, err = schema.ParseSize(v); err != nil || pool < 0 {
				return false, 0, invalid("%s=%q: not a byte count", EnvPoolBytes, v)
			}
		}
	}
	return on, pool, nil
}

// EnvClusterKey holds a cluster key (64 hex digits) for runtimes whose
// config has none.
const EnvClusterKey = schema.EnvClusterKey

// ParseConfig decodes JSON (empty means the zero Config) by the schema:
// an unknown key is an error that names it and suggests the field meant,
// an old name (listen, allow, deny, transfer_timeout_ms) is read as its
// field with a warning once per process. Errors wrap ErrInvalidArgument
// and a *schema.FieldError.
func ParseConfig(p []byte) (Config, error) {
	var c Config
	if err := schema.Decode(p, schema.JSON, &c, nil); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return c, nil
}

// fieldErr is an invalid field of the config.
func fieldErr(name, format string, args ...any) error {
	return fmt.Errorf("%w: %w", ErrInvalidArgument, schema.Bad(name, format, args...))
}

func (c Config) rdtConfig(ctx context.Context) (rdt.Config, []closer, error) {
	var out rdt.Config
	switch {
	case c.Discover:
		d, err := topology.Discover(ctx, topology.DiscoverConfig{HostID: c.Host})
		if err != nil {
			return out, nil, fmt.Errorf("discover topology: %w", err)
		}
		out.Cluster = d.Cluster()
		out.Host = d.Host.ID
	default:
		preset, hosts := c.Preset, c.Hosts
		if preset == "" {
			preset = "dgx-h100"
		}
		if hosts == 0 {
			hosts = 1
		}
		cl, err := topology.Preset(preset, hosts)
		if err != nil {
			return out, nil, fieldErr("preset", "%v", err)
		}
		out.Cluster, out.Host = cl, c.Host
	}
	out.ListenAddrs, out.DataAddr = c.ListenAddrs, c.DataAddr
	out.AllowTransports, out.DenyTransports = c.AllowTransports, c.DenyTransports
	out.DisableRDMA, out.RDMAProvider = c.DisableRDMA, c.RDMAProvider
	out.EncryptData, out.IgnoreEnv = c.EncryptData, c.IgnoreEnv
	for _, s := range c.AllowPeers {
		id, err := peer.Decode(s)
		if err != nil {
			return out, nil, fieldErr("allow_peers", "%q is not a peer ID: %v", s, err)
		}
		out.AllowPeers = append(out.AllowPeers, id)
	}
	var err error
	if out.Identity, err = schema.LoadIdentity(c.IdentityFile); err != nil {
		return out, nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	switch {
	case c.ClusterKey != "" && c.ClusterKeyFile != "":
		return out, nil, fieldErr("cluster_key", "set cluster_key or cluster_key_file, not both")
	case c.ClusterKeyFile != "":
		if out.ClusterKey, err = schema.LoadClusterKey(c.ClusterKeyFile); err != nil {
			return out, nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
	case c.ClusterKey != "":
		if out.ClusterKey, err = schema.ParseKey(c.ClusterKey); err != nil {
			return out, nil, fieldErr("cluster_key", "%v", err)
		}
	case c.getenv(EnvClusterKey) != "":
		if out.ClusterKey, err = schema.ParseKey(c.getenv(EnvClusterKey)); err != nil {
			return out, nil, invalid("%s: %v", EnvClusterKey, err)
		}
	}
	out.DeviceBackend, out.VisibleDevices, out.RuntimeDir = c.DeviceBackend, c.VisibleDevices, c.RuntimeDir
	out.DeviceMemory, out.HostMemory = int64(c.DeviceMemory), int64(c.HostMemory)
	out.TransferTimeout, out.StallTimeout = time.Duration(c.TransferTimeout), time.Duration(c.StallTimeout)
	out.LeaseRenew, out.LeaseExpiry = time.Duration(c.LeaseRenew), time.Duration(c.LeaseExpiry)
	out.HeartbeatInterval, out.HeartbeatMisses = time.Duration(c.HeartbeatInterval), c.HeartbeatMisses
	out.InboxSize = c.InboxSize
	slabs, pool, err := c.slabs()
	if err != nil {
		return out, nil, err
	}
	// The accelerators come with sim_devices or a device_backend; without
	// either, a C ABI runtime has host memory only.
	devices := c.SimDevices || c.DeviceBackend != ""
	var owned []closer
	switch {
	case slabs && devices:
		return out, nil, fieldErr("slabs", "slab memory is for host memory, not with sim_devices or device_backend")
	case slabs && out.ClusterKey == nil:
		return out, nil, fieldErr("slabs", "slab memory is shared within a trust scope: it needs a cluster key (cluster_key, cluster_key_file or %s)", EnvClusterKey)
	case slabs:
		np, err := c.nodePool(out.RuntimeDir, out.Host)
		if err != nil {
			return out, nil, err
		}
		var source tensor.SlabSource
		if np != nil {
			source = np
			owned = append(owned, np)
		}
		sm, err := tensor.NewSlabMemory(tensor.SlabConfig{SlabSize: int64(c.SlabBytes), Reserve: pool, Capacity: int64(c.HostMemory), Source: source})
		if err != nil {
			closeAll(owned)
			return out, nil, fieldErr("slab_bytes", "%v", err)
		}
		// The pool is populated before the runtime starts, so the first
		// transfer into it pays no page population (that is its point).
		if err := sm.WaitPopulated(ctx); err != nil {
			sm.Close()
			closeAll(owned)
			return out, nil, err
		}
		out.Devices = []tensor.Memory{sm}
		owned = append(owned, sm)
	case !devices:
		hm := tensor.NewHostMemory(int64(c.HostMemory))
		if err := hm.Prefault(pool); err != nil {
			hm.Close()
			return out, nil, err
		}
		out.Devices = []tensor.Memory{hm}
		owned = append(owned, hm)
	}
	var level slog.Level
	switch strings.ToLower(c.LogLevel) {
	case "":
		out.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	case "warn":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	default:
		closeAll(owned)
		return out, nil, fieldErr("log_level", "%q (want debug, info, warn or error)", c.LogLevel)
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	}
	return out, owned, nil
}

// EnvNodePool sizes the node pool's budget when the config does not
// (bytes, or with a K, M or G suffix; negative: no pool).
const EnvNodePool = schema.EnvNodePool

// nodePoolLog is where node pool clients log (their one fallback line):
// the runtime's logger is made after its memory.
var nodePoolLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// nodePool returns a client of host's warm pool (tensor/nodepool) in
// runtime directory dir ("": the runtime's default), or nil when the
// config turns it off. The client connects, and starts the helper with
// node_pool_helper, in the background: until then new slabs are made here.
func (c Config) nodePool(dir, host string) (*nodepool.Client, error) {
	budget := int64(c.NodePoolBytes)
	if budget == 0 {
		if v := strings.TrimSpace(c.getenv(EnvNodePool)); v != "" {
			var err error
			if budget, err = schema.ParseSize(v); err != nil {
				if n, perr := strconv.ParseInt(v, 10, 64); perr == nil {
					budget = n
				} else {
					return nil, invalid("%s=%q: not a byte count", EnvNodePool, v)
				}
			}
		}
	}
	if budget < 0 {
		return nil, nil
	}
	if budget == 0 {
		budget = nodepool.DefaultBudget
	}
	if dir == "" {
		dir = c.getenv(rdt.EnvRuntimeDir)
	}
	if dir == "" {
		d, _, err := privdir.UserDir()
		if err != nil {
			nodePoolLog.Warn("capi: no private runtime directory for the node pool; slabs are made without it", "err", err)
			return nil, nil
		}
		dir = d
	} else if err := privdir.Ensure(dir); err != nil {
		nodePoolLog.Warn("capi: the runtime directory is not private; slabs are made without the node pool", "err", err)
		return nil, nil
	}
	var helper []string
	if len(c.NodePoolHelper) > 0 {
		helper = append(slices.Clone(c.NodePoolHelper), "--budget", strconv.FormatInt(budget, 10))
	}
	return nodepool.Open(nodepool.HostSocketPath(dir, host), helper, nodePoolLog), nil
}

// shmSelected reports whether the transports the config selects,
// with TENSORLANE_TRANSPORTS on top (as rdt applies them), include shm: only
// then can a same-host reader want a foreign Put's staged copy.
func (c Config) shmSelected() bool {
	allow, deny := c.AllowTransports, c.DenyTransports
	envAllow, envDeny, err := fabric.ParseSelection(c.getenv(fabric.EnvTransports))
	if err == nil {
		if envAllow != nil {
			allow = envAllow
		}
		deny = append(slices.Clone(deny), envDeny...)
	}
	return (len(allow) == 0 || slices.Contains(allow, fabric.SHM)) && !slices.Contains(deny, fabric.SHM)
}

// closer is memory the runtime made and closes at shutdown.
type closer interface{ Close() error }

// closeAll closes memories a runtime was given, in order; their Close
// gives back only what nothing uses, so its error says nothing to act on.
func closeAll(cs []closer) {
	for _, c := range cs {
		c.Close()
	}
}

// Library holds the runtimes of a process behind handles.
type Library struct {
	mu       sync.Mutex
	next     uint64
	runtimes map[uint64]*Runtime
	// What closed runtimes' callers still held: memory from Alloc and Get
	// (by address) and views (by handle). Closing a runtime must not unmap
	// memory that live arrays use (touching them would crash the host
	// process); it stays mapped here until FreeMemory or ReleaseView.
	orphanMem   map[uintptr]orphan[*allocation]
	orphanViews map[uint64]orphan[*heldView]
}

// orphan is what a closed runtime's caller still holds, with the handle of
// that runtime: only it gives it back.
type orphan[T any] struct {
	rt uint64
	v  T
}

// New returns an empty Library.
func New() *Library {
	return &Library{runtimes: map[uint64]*Runtime{}, orphanMem: map[uintptr]orphan[*allocation]{}, orphanViews: map[uint64]orphan[*heldView]{}}
}

// NewRuntime starts a runtime from a JSON config and returns its handle.
func (l *Library) NewRuntime(ctx context.Context, configJSON []byte) (uint64, error) {
	c, err := ParseConfig(configJSON)
	if err != nil {
		return 0, err
	}
	rc, owned, err := c.rdtConfig(ctx)
	if err != nil {
		return 0, err
	}
	rt, err := rdt.New(ctx, rc)
	if err != nil {
		closeAll(owned)
		return 0, err
	}
	// The runtime does not own the memories it was given: a start that
	// fails after it closes them here, as shutdown does.
	fail := func(err error) (uint64, error) {
		rt.Shutdown(ctx)
		closeAll(owned)
		return 0, err
	}
	actor, err := rt.Spawn("main")
	if err != nil {
		return fail(err)
	}
	mem, err := rt.Memory(tensor.HostDevice)
	if err != nil {
		return fail(err)
	}
	limit := int64(c.StagePoolBytes)
	if limit == 0 {
		limit = DefaultStagePool
	}
	_, isSlab := mem.(*tensor.SlabMemory)
	if isSlab {
		limit = 0 // slab memory is populated and recycled already
	}
	r := &Runtime{rt: rt, actor: actor, host: mem, pool: newStagePool(mem, max(limit, 0)), owned: owned, slabs: isSlab, allocs: map[uintptr]*allocation{}, lazyStaging: c.LazyStaging || !c.shmSelected(),
		objects: map[fabric.ObjectID]*published{}, ops: map[uint64]context.CancelFunc{}, views: map[uint64]*heldView{}}
	l.mu.Lock()
	l.next++
	h := l.next
	l.runtimes[h] = r
	l.mu.Unlock()
	return h, nil
}

// Runtime returns the runtime behind a handle.
func (l *Library) Runtime(h uint64) (*Runtime, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.runtimes[h]
	if !ok {
		return nil, invalid("no runtime with handle %d (closed, or never opened)", h)
	}
	return r, nil
}

// Close shuts a runtime down and forgets its handle. Closing a handle
// twice is not an error.
func (l *Library) Close(ctx context.Context, h uint64) error {
	l.mu.Lock()
	r, ok := l.runtimes[h]
	delete(l.runtimes, h)
	l.mu.Unlock()
	if !ok {
		return nil
	}
	mem, views, err := r.shutdown(ctx)
	l.mu.Lock()
	for a, m := range mem {
		l.orphanMem[a] = orphan[*allocation]{h, m}
	}
	for v, hv := range views {
		l.orphanViews[v] = orphan[*heldView]{h, hv}
	}
	l.mu.Unlock()
	return err
}

// FreeMemory gives back memory from runtime h's Alloc or Get, also after h
// was closed (the memory stayed mapped for the caller until now).
func (l *Library) FreeMemory(h uint64, p unsafe.Pointer) error {
	r, err := l.Runtime(h)
	if err == nil {
		if err = r.FreeMemory(p); err == nil {
			return nil
		}
	}
	l.mu.Lock()
	o, ok := l.orphanMem[uintptr(p)]
	if ok && o.rt == h {
		delete(l.orphanMem, uintptr(p))
	}
	l.mu.Unlock()
	if !ok || o.rt != h {
		return err
	}
	return o.v.shared.Release()
}

// ReleaseView unmaps a view of runtime h, also after h was closed.
// Releasing twice is not an error; nor is a handle of another runtime, and
// it releases nothing.
func (l *Library) ReleaseView(h, view uint64) error {
	if r, err := l.Runtime(h); err == nil {
		r.mu.Lock()
		_, live := r.views[view]
		r.mu.Unlock()
		if live {
			return r.ReleaseView(view)
		}
	}
	l.mu.Lock()
	o, ok := l.orphanViews[view]
	if ok && o.rt == h {
		delete(l.orphanViews, view)
	}
	l.mu.Unlock()
	if !ok || o.rt != h {
		l.mu.Lock()
		_, open := l.runtimes[h]
		closed := !open && h != 0 && h <= l.next
		l.mu.Unlock()
		if !open && !closed {
			_, err := l.Runtime(h)
			return err
		}
		return nil // released before, or never this runtime's
	}
	return o.v.v.Release()
}

// Orphans is what closed runtimes' callers still hold: allocations and
// views not yet given back.
func (l *Library) Orphans() (allocs, views int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.orphanMem), len(l.orphanViews)
}

// CloseAll shuts every runtime down (at process exit).
func (l *Library) CloseAll(ctx context.Context) error {
	l.mu.Lock()
	hs := make([]uint64, 0, len(l.runtimes))
	for h := range l.runtimes {
		hs = append(hs, h)
	}
	l.mu.Unlock()
	var errs []error
	for _, h := range hs {
		errs = append(errs, l.Close(ctx, h))
	}
	return errors.Join(errs...)
}

// Runtime is one rdt runtime with one actor, the memory it handed out, the
// objects it published and the Gets in flight.
type Runtime struct {
	rt    *rdt.Runtime
	actor *rdt.Actor
	host  tensor.Memory
	pool  *stagePool // where foreign Puts stage
	owned []closer
	slabs bool // host memory is slab memory (Config.Slabs)

	mu      sync.Mutex
	allocs  map[uintptr]*allocation
	objects map[fabric.ObjectID]*published
	ops     map[uint64]context.CancelFunc
	views   map[uint64]*heldView

	stats counters

	lazyStaging bool
	staging     sync.WaitGroup // background staging copies (Put)
}

type allocation struct {
	shared *tensor.Shared
	base   uintptr
	n      int64
}

// published is an object this runtime owns, and how its memory is held.
type published struct {
	ref     rdt.Ref
	foreign *tensor.Foreign // nil: a window of shareable memory
}

type counters struct {
	puts, putBytes, zeroCopyPuts, foreignPuts, gatheredPuts, gatheredSummed atomic.Int64
	gets, getBytes, getErrors, getNanos, stagedCopies                       atomic.Int64
	views                                                                   atomic.Int64
	byTransportMu                                                           sync.Mutex
	byTransport                                                             map[string]int64
}

// shutdown stops the runtime. The memory and views its caller still holds
// stay mapped and are returned, for the Library to give back when the
// caller does (FreeMemory, ReleaseView): unmapping them under live arrays
// would crash the process (at interpreter exit, an atexit hook that runs
// after tl_shutdown_all). Live views are first made private copies
// (detachViews), as the owner takes back what they held once this
// runtime's leases go.
func (r *Runtime) shutdown(ctx context.Context) (map[uintptr]*allocation, map[uint64]*heldView, error) {
	r.mu.Lock()
	for _, cancel := range r.ops {
		cancel()
	}
	r.mu.Unlock()
	detachErr := r.detachViews()
	r.releaseDevice() // device.go: allocations the caller did not free
	err := r.rt.Shutdown(ctx)
	r.staging.Wait() // each ends with its copy; the objects are gone
	r.pool.close()
	r.mu.Lock()
	allocs, views := r.allocs, r.views
	r.allocs, r.views = map[uintptr]*allocation{}, map[uint64]*heldView{}
	r.mu.Unlock()
	// Memory still allocated stays mapped: Close gives back only what
	// nothing uses (cached and reserved memory).
	closeAll(r.owned)
	return allocs, views, errors.Join(err, detachErr)
}

// Rdt returns the runtime itself (for Go code in the same process).
func (r *Runtime) Rdt() *rdt.Runtime { return r.rt }

// Alloc allocates n bytes of shareable host memory and returns its address.
// The memory stays valid until FreeMemory, and after it for as long as a
// published object holds part of it.
func (r *Runtime) Alloc(ctx context.Context, n int64) (unsafe.Pointer, error) {
	if n <= 0 {
		return nil, invalid("allocation of %d bytes", n)
	}
	if n > maxAlloc {
		return nil, invalid("allocation of %d bytes: more than any address space holds", n)
	}
	buf, err := r.host.Alloc(ctx, n)
	if err != nil {
		return nil, err
	}
	p, err := tensor.BytesOf(buf)
	if err != nil {
		buf.Release()
		return nil, err
	}
	// The memory is a mapping, not Go's heap: its address is stable.
	a := &allocation{shared: tensor.NewShared(buf), base: uintptr(unsafe.Pointer(&p[0])), n: n}
	r.mu.Lock()
	r.allocs[a.base] = a
	r.mu.Unlock()
	return unsafe.Pointer(&p[0]), nil
}

// maxAlloc bounds one allocation: 48-bit user address spaces hold no more
// (and a memfd of INT64_MAX bytes fails as an untyped error).
const maxAlloc = 1 << 47

// FreeMemory gives back memory from Alloc or Get. Objects published from it
// keep their part until they are freed.
func (r *Runtime) FreeMemory(p unsafe.Pointer) error {
	addr := uintptr(p)
	r.mu.Lock()
	a, ok := r.allocs[addr]
	delete(r.allocs, addr)
	r.mu.Unlock()
	if !ok {
		return invalid("address %#x is not the start of memory this runtime allocated", addr)
	}
	return a.shared.Release()
}

// owning returns the allocation that holds [addr, addr+n), if any.
func (r *Runtime) owning(addr uintptr, n int64) *allocation {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a, ok := r.allocs[addr]; ok && n <= a.n {
		return a
	}
	for _, a := range r.allocs { // a region inside an allocation (a slice of an array)
		if addr >= a.base && uint64(addr-a.base)+uint64(n) <= uint64(a.n) {
			return a
		}
	}
	return nil
}

// Region is a tensor in the caller's memory: mem covers its span from the
// first byte; shape and strides are in elements (DLPack), strides nil for
// row-major.
type Region struct {
	Mem     []byte
	DType   string
	Shape   []int64
	Strides []int64
}

func (g Region) desc() (tensor.Desc, error) {
	dt, err := tensor.ParseDType(g.DType)
	if err != nil {
		return tensor.Desc{}, invalid("unsupported dtype %q (supported: bool, int8..int64, uint8, float16, bfloat16, float32, float64, float8)", g.DType)
	}
	d := tensor.Desc{DType: dt, Shape: g.Shape, Strides: g.Strides}
	if d.Strides == nil {
		d.Strides = tensor.ContiguousStrides(g.Shape)
	}
	if err := d.Validate(); err != nil {
		return d, err
	}
	if _, end := d.Span(); end > int64(len(g.Mem)) {
		return d, invalid("%v spans %d bytes, the region has %d", d, end, len(g.Mem))
	}
	return d, nil
}

// Put publishes a region and returns its marshalled Ref. A region inside
// shareable memory is published without a copy; other memory is read in
// place by network paths and copied once for a same-host reader in another
// process. The caller keeps foreign memory alive and unchanged until Free.
func (r *Runtime) Put(ctx context.Context, g Region) ([]byte, error) {
	d, err := g.desc()
	if err != nil {
		return nil, err
	}
	if len(g.Mem) == 0 {
		return nil, invalid("empty region: nothing to publish")
	}
	_, end := d.Span()
	if end == 0 {
		// A shape with a zero dimension ([0, 5]): no bytes to publish,
		// and no first byte to take the address of.
		return nil, invalid("%v holds no bytes: nothing to publish", d)
	}
	mem := g.Mem[:end]
	addr := uintptr(unsafe.Pointer(&mem[0]))
	var buf tensor.Buffer
	var foreign *tensor.Foreign
	if a := r.owning(addr, end); a != nil {
		buf, err = a.shared.Window(int64(addr-a.base), end)
		if err != nil {
			return nil, err
		}
	} else {
		foreign = tensor.NewForeign(mem, tensor.ForeignConfig{Stage: r.pool})
		buf = foreign
	}
	ref, p, err := r.publish(ctx, buf, d, foreign, foreign != nil)
	if err != nil {
		return nil, err
	}
	if foreign != nil && !r.lazyStaging && slices.Contains(ref.Transports, fabric.SHM) {
		// A same-host reader (another Ray actor on the node) would
		// otherwise wait for this copy; a Free meanwhile waits for it.
		r.staging.Go(func() { foreign.Stage() })
	}
	return p, nil
}

// publish makes buf, holding a tensor of layout d, an object of this
// runtime and returns its ref, marshalled too. It takes buf over (released
// on error). foreign is the staging wrapper of memory the caller owns, if
// any; foreignPut counts the put as one of memory the runtime did not
// allocate (a copy or a wrapper) rather than a zero-copy one.
func (r *Runtime) publish(ctx context.Context, buf tensor.Buffer, d tensor.Desc, foreign *tensor.Foreign, foreignPut bool, opts ...rdt.PutOption) (rdt.Ref, []byte, error) {
	t, err := tensor.New(buf, d)
	if err != nil {
		buf.Release()
		return rdt.Ref{}, nil, err
	}
	ref, err := r.actor.Put(ctx, t, opts...)
	if err != nil {
		buf.Release()
		return rdt.Ref{}, nil, err
	}
	p, err := ref.MarshalBinary()
	if err != nil {
		r.actor.Free(ctx, ref)
		return rdt.Ref{}, nil, err
	}
	r.mu.Lock()
	r.objects[ref.Object] = &published{ref: ref, foreign: foreign}
	r.mu.Unlock()
	_, end := d.Span()
	r.stats.puts.Add(1)
	r.stats.putBytes.Add(end)
	if foreignPut {
		r.stats.foreignPuts.Add(1)
	} else {
		r.stats.zeroCopyPuts.Add(1)
	}
	return ref, p, nil
}

func parseRef(p []byte) (rdt.Ref, error) { return rdt.ParseRef(p) }

// begin registers a cancellable operation under op (0: not cancellable
// from outside) with a timeout (0: the runtime's transfer timeout).
func (r *Runtime) begin(ctx context.Context, op uint64, timeout time.Duration) (context.Context, func()) {
	var cancel context.CancelFunc
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	if op == 0 {
		return ctx, cancel
	}
	r.mu.Lock()
	r.ops[op] = cancel
	r.mu.Unlock()
	return ctx, func() {
		r.mu.Lock()
		delete(r.ops, op)
		r.mu.Unlock()
		cancel()
	}
}

// Cancel cancels the Get registered under op; it reports whether one was
// in flight.
func (r *Runtime) Cancel(op uint64) bool {
	r.mu.Lock()
	cancel, ok := r.ops[op]
	r.mu.Unlock()
	if ok {
		cancel()
	}
	return ok
}

func (r *Runtime) count(x rdt.Transfer, start time.Time, err error) {
	r.stats.gets.Add(1)
	if err != nil {
		r.stats.getErrors.Add(1)
		return
	}
	r.stats.getBytes.Add(x.Stats.Bytes)
	r.stats.getNanos.Add(int64(time.Since(start)))
	r.stats.byTransportMu.Lock()
	if r.stats.byTransport == nil {
		r.stats.byTransport = map[string]int64{}
	}
	r.stats.byTransport[x.Stats.Transport]++
	r.stats.byTransportMu.Unlock()
}

// GetInto reads the ref's tensor into dst, which must hold its span. op,
// when not 0, names the Get for Cancel.
func (r *Runtime) GetInto(ctx context.Context, refBytes, dst []byte, op uint64, timeout time.Duration) (rdt.Transfer, error) {
	ref, n, err := refFor(refBytes, int64(len(dst)))
	if err != nil {
		return rdt.Transfer{}, err
	}
	return r.getInto(ctx, ref, tensor.NewForeign(dst[:n], tensor.ForeignConfig{}), n, op, timeout)
}

// refFor parses a ref whose object a destination of have bytes is to
// receive, and returns the object's span: an empty object or a destination
// too small for it is refused before anything moves.
func refFor(refBytes []byte, have int64) (rdt.Ref, int64, error) {
	ref, err := parseRef(refBytes)
	if err != nil {
		return rdt.Ref{}, 0, err
	}
	_, n := spanOf(ref.Desc)
	if n == 0 {
		return rdt.Ref{}, 0, invalid("the object is empty")
	}
	if have < n {
		return rdt.Ref{}, 0, fmt.Errorf("%w: destination holds %d bytes, the object has %d", rdt.ErrTooSmall, have, n)
	}
	return ref, n, nil
}

// getInto reads ref's n bytes into dst (host or device memory) as one
// counted Get that op names for Cancel.
func (r *Runtime) getInto(ctx context.Context, ref rdt.Ref, dst tensor.Buffer, n int64, op uint64, timeout time.Duration) (rdt.Transfer, error) {
	t, err := tensor.New(dst, tensor.NewDesc(tensor.Uint8, n))
	if err != nil {
		return rdt.Transfer{}, err
	}
	ctx, done := r.begin(ctx, op, timeout)
	defer done()
	start := time.Now()
	x, err := r.actor.GetInto(ctx, ref, t)
	r.count(x, start, err)
	return x, err
}

// Get reads the ref's tensor into new shareable memory and returns its
// address and length (give it back with FreeMemory; Put of it costs no
// copy). The memory is allocated by rdt's Fetch, after the owner confirmed
// the ref's layout (a lease, or this runtime's own object table): a ref
// whose shape was forged larger fails with an error of kind
// layout_mismatch and costs this runtime no memory, in slab mode no slab.
func (r *Runtime) Get(ctx context.Context, refBytes []byte, op uint64, timeout time.Duration) (unsafe.Pointer, int64, rdt.Transfer, error) {
	ref, err := parseRef(refBytes)
	if err != nil {
		return nil, 0, rdt.Transfer{}, err
	}
	_, n := spanOf(ref.Desc)
	if n == 0 {
		return nil, 0, rdt.Transfer{}, invalid("the object is empty")
	}
	ctx, done := r.begin(ctx, op, timeout)
	defer done()
	start := time.Now()
	t, x, err := r.actor.Fetch(ctx, ref, tensor.HostDevice)
	r.count(x, start, err)
	if err != nil {
		return nil, 0, x, err
	}
	if x.Stats.ZeroCopy {
		// The owner's own buffer (a ref this runtime owns, read in
		// place): the caller gets memory of its own, which it may write
		// and must free, as from any other Get. The layout is confirmed
		// by now, so this allocation is the object's true size.
		src, err := t.SpanBytes()
		if err != nil {
			t.Release()
			return nil, 0, x, err
		}
		p, err := r.Alloc(ctx, int64(len(src)))
		if err != nil {
			t.Release()
			return nil, 0, x, err
		}
		copy(unsafe.Slice((*byte)(p), len(src)), src)
		t.Release()
		return p, int64(len(src)), x, nil
	}
	buf := t.Buffer()
	p, err := tensor.BytesOf(buf)
	if err == nil && int64(len(p)) < n {
		err = fmt.Errorf("capi: a Get delivered %d bytes of a %d-byte object", len(p), n)
	}
	if err != nil {
		buf.Release()
		return nil, 0, x, err
	}
	// The memory is a mapping, not Go's heap: its address is stable.
	a := &allocation{shared: tensor.NewShared(buf), base: uintptr(unsafe.Pointer(&p[0])), n: n}
	r.mu.Lock()
	r.allocs[a.base] = a
	r.mu.Unlock()
	return unsafe.Pointer(&p[0]), n, x, nil
}

func spanOf(d tensor.Desc) (int64, int64) {
	if d.Validate() != nil {
		return 0, 0
	}
	start, end := d.Span()
	return start, end - start
}

// Hold keeps another runtime's object alive for this reader until Release
// (rdt.Actor.Hold): a Get's own lease lasts only for the Get (and a moment
// after). The owner confirms the ref's layout, as for a Get. A ref this
// runtime owns needs no hold.
func (r *Runtime) Hold(ctx context.Context, refBytes []byte, timeout time.Duration) error {
	ref, err := parseRef(refBytes)
	if err != nil {
		return err
	}
	if err := ref.Desc.Validate(); err != nil {
		return fmt.Errorf("%w: %v", rdt.ErrMalformedRef, err)
	}
	ctx, done := r.begin(ctx, 0, timeout)
	defer done()
	return r.actor.Hold(ctx, ref)
}

// Release says this runtime is done with a ref: a reader drops its Hold;
// the owner frees the object once no reader holds it.
func (r *Runtime) Release(ctx context.Context, refBytes []byte) error {
	ref, err := parseRef(refBytes)
	if err != nil {
		return err
	}
	if err := r.actor.Release(ctx, ref); err != nil {
		return err
	}
	return nil
}

// Free revokes an object this runtime owns and waits (up to timeout, 0 =
// the transfer timeout) until no read uses its memory any more, so the
// caller may then let go of foreign memory. Freeing twice is not an error.
func (r *Runtime) Free(ctx context.Context, refBytes []byte, timeout time.Duration) error {
	ref, err := parseRef(refBytes)
	if err != nil {
		return err
	}
	if err := r.actor.Free(ctx, ref); err != nil && !errors.Is(err, rdt.ErrObjectFreed) && !errors.Is(err, rdt.ErrObjectNotFound) {
		return err
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	err = r.actor.WaitFreed(ctx, ref)
	if errors.Is(err, rdt.ErrObjectNotFound) {
		err = nil // freed long ago
	}
	if err == nil {
		r.mu.Lock()
		if p, ok := r.objects[ref.Object]; ok {
			if p.foreign != nil && p.foreign.Staged() {
				r.stats.stagedCopies.Add(1)
			}
			delete(r.objects, ref.Object)
		}
		r.mu.Unlock()
	}
	return err
}

// Explanation is Explain's answer.
type Explanation struct {
	// Plan is rdt's, in its own JSON: the old fields (path as text,
	// best, chosen, degraded, candidates with transport, usable, gbps as
	// a number, reason) and, added since, src, dst, via, stripes,
	// zero_copy, fallback and problem.
	Plan rdt.Plan `json:"plan"`
	// Memory, for objects this runtime owns: "shareable" (published from
	// tensorlane memory, no copy on any path), "foreign, not copied"
	// (network paths read it in place; no same-host reader yet) or
	// "foreign, copied once into shareable memory" (a reader in another
	// process on this host asked).
	Memory string `json:"memory,omitempty"`
}

// Explain says which path a Get of the ref into host memory here would
// take and why, and, for an object this runtime owns, how its memory is
// shared.
func (r *Runtime) Explain(refBytes []byte) (Explanation, error) {
	ref, err := parseRef(refBytes)
	if err != nil {
		return Explanation{}, err
	}
	e := Explanation{Plan: r.actor.Explain(ref, tensor.HostDevice)}
	r.mu.Lock()
	p, ok := r.objects[ref.Object]
	r.mu.Unlock()
	switch {
	case !ok || ref.Owner != r.rt.ID():
	case p.foreign == nil:
		e.Memory = "shareable"
	case p.foreign.Staged():
		e.Memory = "foreign, copied once into shareable memory"
	default:
		e.Memory = "foreign, not copied"
	}
	return e, nil
}

// RefInfo describes a marshalled ref without a runtime.
type RefInfo struct {
	DType   string  `json:"dtype"`
	Shape   []int64 `json:"shape"`
	Strides []int64 `json:"strides"`
	Offset  int64   `json:"offset"`
	NBytes  int64   `json:"nbytes"` // the span a Get delivers
	Host    string  `json:"host"`
	Device  string  `json:"device"`
	Owner   string  `json:"owner"`
	Object  string  `json:"object"`
}

// DescribeRef decodes a ref's description.
func DescribeRef(refBytes []byte) (RefInfo, error) {
	ref, err := parseRef(refBytes)
	if err != nil {
		return RefInfo{}, err
	}
	d := ref.Desc.Rebased()
	_, n := spanOf(ref.Desc)
	st := d.Strides
	if st == nil {
		st = tensor.ContiguousStrides(d.Shape)
	}
	// A 0-d tensor (a scalar) has shape [] and strides []: in JSON that
	// must be a list, not null, or a binding cannot build its array.
	shape := d.Shape
	if shape == nil {
		shape = []int64{}
	}
	if st == nil {
		st = []int64{}
	}
	return RefInfo{DType: d.DType.String(), Shape: shape, Strides: st, Offset: d.Offset, NBytes: n,
		Host: ref.Host, Device: ref.Device.String(), Owner: ref.Owner.String(), Object: fmt.Sprint(ref.Object)}, nil
}

// Stats is a runtime's counters, for metrics exporters (Ray's among them).
type Stats struct {
	Puts         int64 `json:"puts"`
	PutBytes     int64 `json:"put_bytes"`
	ZeroCopyPuts int64 `json:"zero_copy_puts"` // published from shareable memory
	ForeignPuts  int64 `json:"foreign_puts"`   // published from foreign memory, or a copy the runtime made
	GatheredPuts int64 `json:"gathered_puts"`  // of which sealed blocks copied by PutGathered
	// GatheredSummed counts the gathered puts whose copy also computed
	// the block checksums (after this runtime's first network read).
	GatheredSummed int64            `json:"gathered_summed"`
	StagedCopies   int64            `json:"staged_copies"` // foreign objects copied once for a same-host reader (counted when freed)
	Gets           int64            `json:"gets"`          // reads, copying or zero-copy
	Views          int64            `json:"views"`         // zero-copy reads (View)
	LiveViews      int              `json:"live_views"`
	GetErrors      int64            `json:"get_errors"`
	GetBytes       int64            `json:"get_bytes"`
	GetSeconds     float64          `json:"get_seconds"`
	ByTransport    map[string]int64 `json:"gets_by_transport"`
	Objects        int              `json:"objects"`         // live objects owned
	ReadsServing   int              `json:"reads_in_flight"` // reads of owned objects in flight
	HostMemory     HostMemory       `json:"host_memory"`
	StagePool      StagePool        `json:"stage_pool"`
	// ShmSlabs counts the owners' slabs this runtime read from (slab
	// mode): mapped (one mmap each), reused (a descriptor for a slab
	// already mapped), hit (no descriptor needed), unmapped.
	ShmSlabs map[string]int64 `json:"shm_slabs"`
	// TCPOwnerChecksums counts the raw blocks this runtime served over tcp
	// by where their checksum came from: cached (a sealed object's, from
	// PutGathered's copy or an earlier read), stored (computed and cached
	// for the next read), computed (at send: the object may change).
	TCPOwnerChecksums map[string]int64 `json:"tcp_owner_checksums"`
	// TCPCompression is what tcp's codec did for this runtime's reads.
	TCPCompression TCPCompression `json:"tcp_compression"`
	// NodePool is the node's warm pool as this runtime saw it (slab
	// mode with node_pool_bytes not negative); nil without one.
	NodePool *NodePool `json:"node_pool,omitempty"`
	Peer     string    `json:"peer"`
	// Address is the runtime's control address (rdt.FormatAddrInfo: /p2p
	// multiaddrs), what Connect takes to reach it ahead of a transfer.
	Address string `json:"address"`
	Host    string `json:"host"`
}

// TCPCompression counts this runtime's tcp transfers by whether they were
// compressed (the codec is on where the link is measured slower than it:
// tcp.CompressAuto), and the compressed ones' bytes before compression and
// on the wire. A benchmark whose data compresses far better than real
// tensors (an array of ones) shows here that the codec carried it.
type TCPCompression struct {
	Compressed int64 `json:"compressed"`
	Plain      int64 `json:"plain"`
	RawBytes   int64 `json:"raw_bytes"`
	WireBytes  int64 `json:"wire_bytes"`
}

// NodePool is what a runtime saw of its node's warm pool (tensor/nodepool):
// whether a helper answers, slabs it served (hits) or could not (misses:
// nothing that large ready; absent: no helper to ask), each a fallback to
// fresh pages made here, the bytes it handed over, and its ready bytes at
// its last answer.
type NodePool struct {
	Connected bool  `json:"connected"`
	Hits      int64 `json:"hits"`
	Misses    int64 `json:"misses"`
	Absent    int64 `json:"absent"`
	Taken     int64 `json:"taken_bytes"`
	Ready     int64 `json:"ready_bytes"`
}

// StagePool is the staging pool's state: bytes held ready (populated,
// never shared; not counted in HostMemory.Used) and how often a staging
// copy found an allocation ready.
type StagePool struct {
	Ready  int64 `json:"ready"`
	Hits   int64 `json:"hits"`
	Misses int64 `json:"misses"`
}

// HostMemory is the runtime's tensorlane host memory: bytes in live
// allocations (shareable arrays, staged copies, received tensors; not the
// staging pool's ready ones), the peak, the allocation count, and released
// bytes kept for reuse.
type HostMemory struct {
	Used   int64 `json:"used"`
	Peak   int64 `json:"peak"`
	Allocs int   `json:"allocs"`
	Cached int64 `json:"cached"`
	// Slabs is set in slab mode (Config.Slabs); SlabCount is the slabs
	// ever created (reusing a freed range creates none).
	Slabs     bool  `json:"slabs"`
	SlabCount int64 `json:"slab_count"`
}

// Stats returns the runtime's counters.
func (r *Runtime) Stats() Stats {
	s := Stats{
		Puts: r.stats.puts.Load(), PutBytes: r.stats.putBytes.Load(),
		ZeroCopyPuts: r.stats.zeroCopyPuts.Load(), ForeignPuts: r.stats.foreignPuts.Load(),
		GatheredPuts: r.stats.gatheredPuts.Load(), GatheredSummed: r.stats.gatheredSummed.Load(), StagedCopies: r.stats.stagedCopies.Load(),
		Views: r.stats.views.Load(), LiveViews: r.Views(),
		Gets: r.stats.gets.Load(), GetErrors: r.stats.getErrors.Load(), GetBytes: r.stats.getBytes.Load(),
		GetSeconds:  time.Duration(r.stats.getNanos.Load()).Seconds(),
		ByTransport: map[string]int64{}, Objects: r.rt.Objects(),
		Peer: r.rt.ID().String(), Address: rdt.FormatAddrInfo(r.rt.AddrInfo()), Host: r.rt.HostID(),
	}
	ms := r.host.Stats()
	ready := r.pool.held.Load()
	s.HostMemory = HostMemory{Used: ms.Used - ready, Peak: ms.Peak, Allocs: ms.Allocs, Cached: ms.Cached}
	s.StagePool = StagePool{Ready: ready, Hits: r.pool.hits.Load(), Misses: r.pool.misses.Load()}
	if sm, ok := r.host.(*tensor.SlabMemory); ok {
		s.HostMemory.Slabs, s.HostMemory.SlabCount = true, sm.Slabs()
	}
	mfs, _ := r.rt.Registry().Gather() // what it could gather, on an error
	s.ShmSlabs = counterSeries(mfs, "tensorlane_shm_slab_events_total", "event")
	s.TCPOwnerChecksums = counterSeries(mfs, "tensorlane_tcp_owner_checksums_total", "source")
	decisions := counterSeries(mfs, "tensorlane_tcp_compression_decisions_total", "compress")
	s.TCPCompression = TCPCompression{Compressed: decisions["true"], Plain: decisions["false"],
		RawBytes:  counterSeries(mfs, "tensorlane_tcp_compressed_raw_bytes_total", "")[""],
		WireBytes: counterSeries(mfs, "tensorlane_tcp_compressed_wire_bytes_total", "")[""]}
	for _, o := range r.owned {
		if np, ok := o.(*nodepool.Client); ok {
			st := np.Stats()
			s.NodePool = &NodePool{Connected: st.Connected, Hits: st.Hits, Misses: st.Misses, Absent: st.Absent, Taken: st.Taken, Ready: st.Ready}
			if st.Connected { // the helper's ready bytes now (one local round trip)
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				if ss, err := np.ServerStats(ctx); err == nil {
					s.NodePool.Ready = ss.Ready
				}
				cancel()
			}
		}
	}
	for _, o := range r.rt.ObjectTable() {
		s.ReadsServing += o.Pins
	}
	r.stats.byTransportMu.Lock()
	for k, v := range r.stats.byTransport {
		s.ByTransport[k] = v
	}
	r.stats.byTransportMu.Unlock()
	return s
}

// counterSeries reads one counter family of mfs (a registry's Gather) by
// the value of one label, summed over its other labels ("" for a family
// without it); empty when the family is not there.
func counterSeries(mfs []*dto.MetricFamily, name, label string) map[string]int64 {
	out := map[string]int64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			v := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					v = l.GetValue()
				}
			}
			out[v] += int64(m.GetCounter().GetValue())
		}
	}
	return out
}
