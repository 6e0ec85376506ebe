package multihost

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/internal/netns"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/rdt/rdttest"
)

func TestMain(m *testing.M) {
	code := testhelp.Isolated(m).Run()
	Cleanup()
	if code == 0 {
		// The spawner thread lives as long as the process, by design.
		if err := goleak.Find(goleak.IgnoreTopFunction("github.com/tensorlane/tensorlane/internal/multihost.spawner")); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			code = 1
		}
	}
	printDetections()
	os.Exit(code)
}

// detections collects how long each failure took to surface, printed at the
// end of the run (go test -v ./internal/multihost/).
var (
	detMu      sync.Mutex
	detections []string
)

func record(t *testing.T, what string, d time.Duration, outcome string) {
	t.Helper()
	line := fmt.Sprintf("%-58s %8.3f s  %s", what, d.Seconds(), outcome)
	t.Log(line)
	detMu.Lock()
	detections = append(detections, line)
	detMu.Unlock()
}

func printDetections() {
	detMu.Lock()
	defer detMu.Unlock()
	if len(detections) == 0 {
		return
	}
	sort.Strings(detections)
	fmt.Println("multihost fault matrix (time from the fault to the outcome):")
	for _, l := range detections {
		fmt.Println("  " + l)
	}
}

// pathCase runs a network fault over one data path.
type pathCase struct {
	name string
	args []string // worker flags
}

// paths are the data paths each network fault runs over: the planner's
// choice between two DGX hosts (rdma, software provider) on every run, and
// tcp too with TENSORLANE_FAULT_MATRIX=full (make nightly).
func paths() []pathCase {
	out := []pathCase{{"planner's choice", nil}}
	if os.Getenv("TENSORLANE_FAULT_MATRIX") == "full" {
		out = append(out, pathCase{"tcp only", []string{"--allow-transports", "tcp"}})
	}
	return out
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func info(t *testing.T, ctx context.Context, w *Worker) Info {
	t.Helper()
	i, err := w.Info(ctx)
	require.NoError(t, err)
	return i
}

func put(t *testing.T, ctx context.Context, w *Worker, size int64, seed uint64) string {
	t.Helper()
	r, err := w.Call(ctx, Request{Op: "put", Size: size, Seed: seed, Device: "gpu:0"})
	require.NoError(t, err)
	require.True(t, r.OK, "put: %s", r.Error)
	return r.Ref
}

func get(t *testing.T, ctx context.Context, w *Worker, ref string, seed uint64) Reply {
	t.Helper()
	r, err := w.Call(ctx, Request{Op: "get", Ref: ref, Seed: seed, Device: "gpu:1", TimeoutMS: 60_000})
	require.NoError(t, err)
	return r
}

func free(t *testing.T, ctx context.Context, w *Worker, ref string) {
	t.Helper()
	r, err := w.Call(ctx, Request{Op: "free", Ref: ref})
	require.NoError(t, err)
	require.True(t, r.OK, "free: %s", r.Error)
}

// await waits for an asynchronous reply.
func await(t *testing.T, res <-chan Result, bound time.Duration) Result {
	t.Helper()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case r := <-res:
		require.NoError(t, r.Err)
		return r
	case <-timer.C:
		t.Fatalf("no reply within %v: the call hung", bound)
	}
	return Result{}
}

// inFlight waits until host has sent at least n more bytes than at from,
// that is until the transfer is really on the wire; it fails if the reply
// comes first.
func inFlight(t *testing.T, ctx context.Context, h *Host, from, n uint64, res <-chan Result) {
	t.Helper()
	var early *Result
	err := WaitFor(ctx, 10*time.Millisecond, func() bool {
		select {
		case r := <-res:
			early = &r
			return true
		default:
		}
		tx, err := h.TxBytes(ctx)
		return err == nil && tx >= from+n
	})
	require.NoError(t, err, "transfer never got %d bytes onto the wire", n)
	require.Nil(t, early, "the transfer ended before the fault could be injected: %+v", early)
}

func txBytes(t *testing.T, ctx context.Context, h *Host) uint64 {
	t.Helper()
	tx, err := h.TxBytes(ctx)
	require.NoError(t, err)
	return tx
}

// backToBaseline waits until the worker's device memory is back to base.
func backToBaseline(t *testing.T, ctx context.Context, w *Worker, base int64, bound time.Duration) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var last Info
	err := WaitFor(wctx, 50*time.Millisecond, func() bool {
		i, err := w.Info(wctx)
		last = i
		return err == nil && i.Used == base
	})
	assert.NoError(t, err, "%s: device memory %d bytes, baseline %d (objects %d)", w.Host.ID, last.Used, base, last.Objects)
}

func rateLimit(t *testing.T, ctx context.Context, h *Host, rate string) {
	t.Helper()
	require.NoError(t, h.NS.Shape(ctx, h.Dev, netns.Shape{Rate: rate}))
}

// 1. kill -9 of an owner in the middle of a large transfer.
func TestKillOwnerMidTransfer(t *testing.T) {
	for _, tc := range paths() {
		t.Run(tc.name, func(t *testing.T) {
			c := New(t, Options{Args: tc.args})
			ctx := testCtx(t, 3*time.Minute)
			owner, reader := c.Hosts[0], c.Hosts[1]
			// 400 Mbit/s keeps 256 MiB on the wire for about five seconds.
			rateLimit(t, ctx, owner, "400mbit")
			readerBase := info(t, ctx, reader.W).Used
			ref := put(t, ctx, owner.W, 256<<20, 1)

			tx := txBytes(t, ctx, owner)
			res := reader.W.Go(Request{Op: "get", Ref: ref, Seed: 1, Device: "gpu:1", TimeoutMS: 60_000})
			inFlight(t, ctx, owner, tx, 32<<20, res)
			killed := time.Now()
			owner.W.Kill()
			r := await(t, res, 30*time.Second)

			require.False(t, r.OK, "a transfer from a killed owner cannot complete")
			assert.Contains(t, []string{"owner_died", "peer_closed"}, r.Code, r.Error)
			record(t, fmt.Sprintf("1 kill -9 owner mid-transfer (256 MiB, %s)", r.Path), r.At.Sub(killed), r.Code)
			backToBaseline(t, ctx, reader.W, readerBase, 5*time.Second)

			// The owner comes back empty and serves again.
			owner.Start(ctx)
			c.Connect(ctx, reader, owner)
			assert.Zero(t, info(t, ctx, owner.W).Used)
			ref = put(t, ctx, owner.W, 1<<20, 2)
			r2 := get(t, ctx, reader.W, ref, 2)
			assert.True(t, r2.OK && r2.Verified, "after the restart: %s", r2.Error)
			free(t, ctx, owner.W, ref)
			backToBaseline(t, ctx, owner.W, 0, 5*time.Second)
		})
	}
}

// 2. the owner's cable pulled at the switch in the middle of a transfer:
// for good (a typed error within the stall/heartbeat bound) or for a second
// (TCP recovers and the transfer completes).
func TestLinkDownMidTransfer(t *testing.T) {
	const stall = 4 * time.Second
	cases := []struct {
		name   string
		outage time.Duration // 0: never restored before the reply
		wantOK bool
	}{
		{"unplugged for good", 0, false},
		{"unplugged for 1s", time.Second, true},
	}
	for _, path := range paths() {
		for _, tc := range cases {
			t.Run(path.name+"/"+tc.name, func(t *testing.T) {
				c := New(t, Options{StallTimeout: stall, Args: path.args})
				ctx := testCtx(t, 3*time.Minute)
				owner, reader := c.Hosts[0], c.Hosts[1]
				rateLimit(t, ctx, owner, "200mbit") // 64 MiB take about 2.7 s
				ownerBase, readerBase := info(t, ctx, owner.W).Used, info(t, ctx, reader.W).Used
				ref := put(t, ctx, owner.W, 64<<20, 3)

				tx := txBytes(t, ctx, owner)
				res := reader.W.Go(Request{Op: "get", Ref: ref, Seed: 3, Device: "gpu:1", TimeoutMS: 60_000})
				inFlight(t, ctx, owner, tx, 8<<20, res)
				cut := time.Now()
				require.NoError(t, owner.SetLink(ctx, false))
				restored := false
				if tc.outage > 0 {
					timer := time.NewTimer(tc.outage) // the length of the outage, not a wait for work
					select {
					case r := <-res:
						t.Fatalf("reply during a %v outage: %+v", tc.outage, r)
					case <-timer.C:
					}
					require.NoError(t, owner.SetLink(ctx, true))
					restored = true
				}
				r := await(t, res, 2*stall+30*time.Second)
				if !restored {
					require.NoError(t, owner.SetLink(ctx, true))
				}
				if tc.wantOK {
					require.True(t, r.OK, "transfer after a %v outage: %s %s", tc.outage, r.Code, r.Error)
					assert.True(t, r.Verified)
					record(t, fmt.Sprintf("2 link down %v mid-transfer (64 MiB, %s)", tc.outage, r.Path), r.At.Sub(cut), "completed, verified")
				} else {
					require.False(t, r.OK)
					assert.Contains(t, []string{"owner_died", "stalled"}, r.Code, r.Error)
					record(t, fmt.Sprintf("2 link down for good mid-transfer (64 MiB, %s)", r.Path), r.At.Sub(cut), r.Code)
				}
				free(t, ctx, owner.W, ref)
				// The owner's half of an aborted transfer ends by its own stall
				// detector at the latest; its memory must then come back.
				backToBaseline(t, ctx, owner.W, ownerBase, 2*stall+10*time.Second)
				backToBaseline(t, ctx, reader.W, readerBase, 5*time.Second)
			})
		}
	}
}

// 3. loss and latency on both hosts' links: the transfer completes and
// verifies. Uses netem where the kernel has it; otherwise random drops by a
// BPF program and the queueing delay of a tbf bottleneck.
func TestLossAndLatency(t *testing.T) {
	for _, path := range paths() {
		t.Run(path.name, func(t *testing.T) { lossAndLatency(t, path) })
	}
}

func lossAndLatency(t *testing.T, path pathCase) {
	c := New(t, Options{StallTimeout: 10 * time.Second, Args: path.args})
	ctx := testCtx(t, 3*time.Minute)
	owner, reader := c.Hosts[0], c.Hosts[1]
	mode := "netem delay 5ms±1ms loss 0.5% both ways"
	var droppers []*netns.Dropper
	for _, h := range []*Host{owner, reader} {
		err := h.NS.Shape(ctx, h.Dev, netns.Shape{Delay: 5 * time.Millisecond, Jitter: time.Millisecond, Loss: 0.5})
		if errors.Is(err, netns.ErrNoNetem) {
			mode = "no netem in this kernel: BPF random drop of 1% of (GSO-sized) packets both ways + tbf 200mbit bottleneck (queueing delay)"
			d, derr := h.NS.DropRandom(h.Dev, 1)
			if derr != nil {
				t.Skipf("skipping: neither netem nor tcx BPF available: %v; %v", err, derr)
			}
			t.Cleanup(func() { d.Close() })
			droppers = append(droppers, d)
			err = h.NS.Shape(ctx, h.Dev, netns.Shape{Rate: "200mbit"})
		}
		require.NoError(t, err)
	}
	ownerBase, readerBase := info(t, ctx, owner.W).Used, info(t, ctx, reader.W).Used
	ref := put(t, ctx, owner.W, 32<<20, 5)
	start := time.Now()
	r := get(t, ctx, reader.W, ref, 5)
	require.True(t, r.OK, "%s %s", r.Code, r.Error)
	assert.True(t, r.Verified)
	var dropped uint64
	for _, d := range droppers {
		dropped += d.Dropped()
	}
	if droppers != nil {
		assert.Positive(t, dropped, "the links dropped nothing: the fault was not injected")
	}
	record(t, fmt.Sprintf("3 loss+latency (32 MiB, %s)", r.Path), time.Since(start), fmt.Sprintf("completed, verified, %.1f MB/s; %s; %d packets dropped", float64(r.Bytes)/r.Seconds/1e6, mode, dropped))
	freed := time.Now()
	free(t, ctx, owner.W, ref)
	backToBaseline(t, ctx, owner.W, ownerBase, 30*time.Second)
	backToBaseline(t, ctx, reader.W, readerBase, 5*time.Second)
	t.Logf("memory back to baseline %.2f s after free", time.Since(freed).Seconds())
}

// 4. an owner restarted under the same identity and addresses: refs from
// its previous life fail cleanly, new refs work. A reader that saw the old
// incarnation die may say so (ErrOwnerDied); one that did not meets the new
// incarnation, which refuses the ref as stale (ErrStaleRef).
func TestRestartSameIdentity(t *testing.T) {
	c := New(t, Options{})
	ctx := testCtx(t, 2*time.Minute)
	owner, reader := c.Hosts[0], c.Hosts[1]
	readerBase := info(t, ctx, reader.W).Used
	old := put(t, ctx, owner.W, 1<<20, 7)
	r := get(t, ctx, reader.W, old, 7)
	require.True(t, r.OK && r.Verified, r.Error)
	peerID := owner.W.Ready.Peer

	killed := time.Now()
	owner.W.Kill()
	// While the owner is down the ref fails fast (nothing listens).
	r = get(t, ctx, reader.W, old, 7)
	require.False(t, r.OK)
	assert.Contains(t, []string{"owner_died", "peer_closed"}, r.Code, r.Error)
	record(t, "4a get from an owner that is down", time.Since(killed), r.Code)

	owner.Start(ctx)
	require.Equal(t, peerID, owner.W.Ready.Peer, "restarted under the same identity")
	c.Connect(ctx, reader, owner)
	start := time.Now()
	r = get(t, ctx, reader.W, old, 7)
	require.False(t, r.OK, "a ref from the owner's previous life was served")
	assert.Contains(t, []string{"stale_ref", "owner_died"}, r.Code, r.Error)
	record(t, "4b old ref after restart (reader saw the death)", time.Since(start), r.Code)

	// A reader that joins after the restart never knew the old incarnation.
	late := c.AddHost(ctx, "late", "h2", "10.77.0.50", true)
	c.Connect(ctx, late, owner)
	start = time.Now()
	r = get(t, ctx, late.W, old, 7)
	require.False(t, r.OK, "a ref from the owner's previous life was served")
	assert.Equal(t, "stale_ref", r.Code, r.Error)
	record(t, "4c old ref after restart (new reader)", time.Since(start), r.Code)

	fresh := put(t, ctx, owner.W, 1<<20, 8)
	for _, w := range []*Worker{reader.W, late.W} {
		r = get(t, ctx, w, fresh, 8)
		assert.True(t, r.OK && r.Verified, "new ref after the restart, read by %s: %s", w.Host.ID, r.Error)
	}
	free(t, ctx, owner.W, fresh)
	backToBaseline(t, ctx, owner.W, 0, 5*time.Second)
	backToBaseline(t, ctx, reader.W, readerBase, 5*time.Second)
	backToBaseline(t, ctx, late.W, 0, 5*time.Second)
}

// 5a. a member of the cluster that was never handed a ref cannot read the
// object by forging one.
func TestForgedRef(t *testing.T) {
	c := New(t, Options{})
	ctx := testCtx(t, 2*time.Minute)
	owner, member := c.Hosts[0], c.Hosts[2]
	ref := put(t, ctx, owner.W, 1<<20, 9)
	cases := []struct {
		name string
		ref  string
		code string
	}{
		{"flipped token bit", rdttest.Forge(t, ref, func(r *rdt.Ref) { r.Token[3] ^= 0x10 }), "unauthorized"},
		{"random token", rdttest.Forge(t, ref, func(r *rdt.Ref) { rand.Read(r.Token) }), "unauthorized"},
		{"no token", rdttest.Forge(t, ref, func(r *rdt.Ref) { r.Token = nil }), "unauthorized"},
		{"guessed object id", rdttest.Forge(t, ref, func(r *rdt.Ref) { rand.Read(r.Object[:]) }), "object_not_found"},
		{"the real ref", ref, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := get(t, ctx, member.W, tc.ref, 9)
			if tc.code == "" {
				assert.True(t, r.OK && r.Verified, r.Error)
				return
			}
			require.False(t, r.OK, "a forged ref was served")
			assert.Equal(t, tc.code, r.Code, r.Error)
			assert.NotContains(t, strings.ToLower(r.Error), "panic")
			record(t, "5a forged ref: "+tc.name, time.Since(start), r.Code)
		})
	}
	free(t, ctx, owner.W, ref)
	backToBaseline(t, ctx, owner.W, 0, 5*time.Second)
	backToBaseline(t, ctx, member.W, 0, 5*time.Second)
}
