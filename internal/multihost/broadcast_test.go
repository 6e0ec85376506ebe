package multihost

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/bench/harness"
	"github.com/tensorlane/tensorlane/internal/netns"
	"github.com/tensorlane/tensorlane/rdt"
)

// bcastSlot is a slot reserved on a host's worker.
type bcastSlot struct {
	h   *Host
	ref string
}

// reserveSpread reserves n slots of size bytes on hosts, one per host in
// turn (GPU 0 on each, then GPU 1...), so the first readers span the hosts.
func reserveSpread(t *testing.T, ctx context.Context, hosts []*Host, n int, size int64) []bcastSlot {
	t.Helper()
	var out []bcastSlot
	for k := range n {
		h := hosts[k%len(hosts)]
		r, err := h.W.Call(ctx, Request{Op: "reserve", Size: size, Device: fmt.Sprintf("gpu:%d", k/len(hosts))})
		require.NoError(t, err)
		require.True(t, r.OK, "reserve: %s", r.Error)
		out = append(out, bcastSlot{h, r.Ref})
	}
	return out
}

func refsOf(s []bcastSlot) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = x.ref
	}
	return out
}

// shapeAll limits every host's link, both directions (the host's side and
// the bridge's side of its cable).
func shapeAll(t *testing.T, ctx context.Context, c *Cluster, rate string) {
	t.Helper()
	for _, h := range c.Hosts {
		require.NoError(t, h.NS.Shape(ctx, h.Dev, netns.Shape{Rate: rate}))
		require.NoError(t, c.Bridge.NS.Shape(ctx, h.Port, netns.Shape{Rate: rate}))
	}
}

// TestBroadcastShaped measures broadcast over real network namespaces with
// each host's link shaped to 1 Gbit/s, where the owner's link is the
// bottleneck: the time for N readers over the time for 1, against N
// readers that each Get the object at once. It is a measurement, not a
// check (no timing threshold): run it with TENSORLANE_BCAST_SHAPED=1
// (figures in docs/benchmarks.md). TENSORLANE_BCAST_SIZE sets the object's
// MiB (default 64) and TENSORLANE_BCAST_READERS the reader counts (default
// 1,2,4,8,16); the concurrent Gets it compares with run only up to 64 MiB
// (1 GiB to 8 readers through one 1 Gbit/s link is over a minute).
// TENSORLANE_BCAST_WINDOWS lists the chunks in flight per edge to compare
// (default rdt's), TENSORLANE_BCAST_CHUNK the chunk in KiB (default rdt's)
// and TENSORLANE_BCAST_RATE the links' rate (default 1gbit; "none" leaves
// them unshaped); TENSORLANE_BCAST_DELAY (a Go duration) adds that delay
// (netem) to each side of every link, so a round trip crosses it 4 times.
func TestBroadcastShaped(t *testing.T) {
	if os.Getenv("TENSORLANE_BCAST_SHAPED") == "" {
		t.Skip("a measurement: set TENSORLANE_BCAST_SHAPED=1 to run it")
	}
	sc := shapedCase{size: 64 << 20, readers: []int{1, 2, 4, 8, 16}, windows: []int{0}, rate: "1gbit"}
	if v := os.Getenv("TENSORLANE_BCAST_SIZE"); v != "" {
		mib, err := strconv.Atoi(v)
		require.NoError(t, err, "TENSORLANE_BCAST_SIZE is MiB")
		sc.size = int64(mib) << 20
	}
	counts := func(name string) []int {
		var out []int
		for _, f := range strings.Split(os.Getenv(name), ",") {
			n, err := strconv.Atoi(f)
			require.NoError(t, err, "%s is a list of counts", name)
			out = append(out, n)
		}
		return out
	}
	if os.Getenv("TENSORLANE_BCAST_READERS") != "" {
		sc.readers = counts("TENSORLANE_BCAST_READERS")
	}
	if os.Getenv("TENSORLANE_BCAST_WINDOWS") != "" {
		sc.windows = counts("TENSORLANE_BCAST_WINDOWS")
	}
	if v := os.Getenv("TENSORLANE_BCAST_CHUNK"); v != "" {
		kib, err := strconv.Atoi(v)
		require.NoError(t, err, "TENSORLANE_BCAST_CHUNK is KiB")
		sc.chunk = int64(kib) << 10
	}
	if v := os.Getenv("TENSORLANE_BCAST_RATE"); v != "" {
		sc.rate = v
	}
	if v := os.Getenv("TENSORLANE_BCAST_DELAY"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "TENSORLANE_BCAST_DELAY is a duration")
		sc.delay = d
	}
	var recs []harness.BroadcastRecord
	for _, tc := range []pathCase{{"rdma", nil}, {"tcp", []string{"--allow-transports", "tcp"}}} {
		t.Run(tc.name, func(t *testing.T) { recs = append(recs, broadcastShaped(t, tc, sc)...) })
	}
	name := "broadcast-shaped"
	if sc.size != 64<<20 {
		name = fmt.Sprintf("broadcast-shaped-%dMiB", sc.size>>20)
	}
	if sc.rate != "1gbit" {
		name += "-" + sc.rate
	}
	if sc.delay > 0 {
		name += "-" + sc.delay.String()
	}
	if sc.chunk != 0 {
		name += fmt.Sprintf("-%dKiB-chunks", sc.chunk>>10)
	}
	if len(sc.windows) > 1 || sc.windows[0] != 0 {
		name += "-windows"
	}
	// TENSORLANE_BCAST_OUT=dir also writes the records and the plot there.
	if dir := os.Getenv("TENSORLANE_BCAST_OUT"); dir != "" {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		f, err := os.Create(filepath.Join(dir, name+".json"))
		require.NoError(t, err)
		require.NoError(t, harness.WriteBroadcastJSON(f, recs))
		require.NoError(t, f.Close())
		require.NoError(t, harness.WriteBroadcastPlotFile(filepath.Join(dir, name+".png"),
			fmt.Sprintf("tensorlane broadcast of %d MiB over %s netns links (4 hosts, 1 process each)", sc.size>>20, sc.rate), recs))
	}
}

// shapedCase is what TestBroadcastShaped measures.
type shapedCase struct {
	size    int64
	readers []int
	windows []int  // chunks in flight per edge (0: rdt's default)
	chunk   int64  // 0: rdt's default
	rate    string // each link's, or "none"
	delay   time.Duration
}

func broadcastShaped(t *testing.T, tc pathCase, sc shapedCase) (recs []harness.BroadcastRecord) {
	size := sc.size
	most := slices.Max(sc.readers)
	// Each device holds one slot per host (reserveSpread), the owner's GPU 0 the object.
	mem := fmt.Sprintf("%dMiB", max(512, size>>20+64))
	c := New(t, Options{Hosts: 4, Args: tc.args, DeviceMemory: mem})
	ctx := testCtx(t, 5*time.Minute+time.Duration(size>>20)*150*time.Millisecond)
	shape := netns.Shape{Rate: sc.rate, Delay: sc.delay}
	links := sc.rate + " netns"
	if sc.rate == "none" {
		shape.Rate = ""
	}
	if sc.delay > 0 {
		links += fmt.Sprintf(" +%v each side", sc.delay)
	}
	if shape != (netns.Shape{}) {
		for _, h := range c.Hosts {
			require.NoError(t, h.NS.Shape(ctx, h.Dev, shape))
			require.NoError(t, c.Bridge.NS.Shape(ctx, h.Port, shape))
		}
	}
	if sc.chunk != 0 {
		links += fmt.Sprintf(", %d KiB chunks", sc.chunk>>10)
	}
	src := put(t, ctx, c.Hosts[0].W, size, 7)
	slots := reserveSpread(t, ctx, c.Hosts[1:], most, size)
	gen := map[string]uint64{}
	one := map[int]float64{} // per window
	// Windows are interleaved per reader count, so load from elsewhere
	// shifts them alike.
	for _, n := range sc.readers {
		for _, window := range sc.windows {
			best, load0 := 0.0, loadAverage()
			for range 2 {
				r, err := c.Hosts[0].W.Call(ctx, Request{Op: "broadcast", Ref: src, Refs: refsOf(slots[:n]), ChunkSize: sc.chunk, Window: window, TimeoutMS: 120_000 + size>>20*100})
				require.NoError(t, err)
				require.True(t, r.OK, "broadcast: %s", r.Error)
				for i, o := range r.Readers {
					require.True(t, o.OK, "reader %d: %s", i, o.Error)
				}
				for _, s := range slots[:n] {
					w, err := s.h.W.Call(ctx, Request{Op: "wait", Ref: s.ref, Seed: 7, After: gen[s.ref], TimeoutMS: 30_000})
					require.NoError(t, err)
					require.True(t, w.OK && w.Verified, "wait: %s", w.Error)
					gen[s.ref] = w.Generation
				}
				if best == 0 || r.Seconds < best {
					best = r.Seconds
				}
				if n == most {
					t.Logf("tree:\n%s", r.Tree)
				}
			}
			if one[window] == 0 { // the first count, 1 unless told otherwise
				one[window] = best
			}
			recs = append(recs, harness.BroadcastRecord{Path: harness.PathBroadcast, Transport: tc.name + ", " + links, Readers: n, Hosts: 4, Size: size, Window: window, Seconds: best, RatioVsOne: best / one[window], Load: load0 + " -> " + loadAverage()})
			record(t, fmt.Sprintf("broadcast %dMiB to %2d readers, %s, %s, window %d", size>>20, n, links, tc.name, window), time.Duration(best*float64(time.Second)), fmt.Sprintf("ratio vs 1 reader %.2f", best/one[window]))
		}
	}
	if size > 64<<20 || !slices.Contains(sc.readers, 1) || !slices.Contains(sc.readers, 8) {
		return recs
	}
	// Today's way: every reader Gets at once, all through the owner's link.
	for _, n := range []int{1, 8} {
		start := time.Now()
		var res []<-chan Result
		for k, s := range slots[:n] {
			res = append(res, s.h.W.Go(Request{Op: "get", Ref: src, Seed: 7, Device: fmt.Sprintf("gpu:%d", 4+k/3), TimeoutMS: 120_000}))
		}
		for _, ch := range res {
			r := await(t, ch, 2*time.Minute)
			require.True(t, r.OK, "get: %s", r.Error)
		}
		d := time.Since(start)
		record(t, fmt.Sprintf("%d concurrent Gets of 64MiB, %s links, %s", n, sc.rate, tc.name), d, "")
		for i := range recs {
			if recs[i].Readers == n && recs[i].Window == sc.windows[0] {
				recs[i].Naive = d.Seconds() // N readers Get at once: all through the owner's link
			}
		}
	}
	for i := range recs {
		recs[i].NaiveRatio = recs[i].Naive / recs[0].Naive
		if recs[i].Naive == 0 || recs[0].Naive == 0 {
			recs[i].NaiveRatio = 0
		}
	}
	return recs
}

// A reader host killed mid-broadcast is routed around: the other readers
// complete with verified bytes and the result names the dead ones.
func TestBroadcastReaderKilled(t *testing.T) {
	c := New(t, Options{Hosts: 4})
	ctx := testCtx(t, 3*time.Minute)
	shapeAll(t, ctx, c, "400mbit")
	const size = 48 << 20
	src := put(t, ctx, c.Hosts[0].W, size, 3)
	slots := reserveSpread(t, ctx, c.Hosts[1:], 6, size)
	victim := c.Hosts[1] // the first host leader: it feeds h2, which feeds h3
	tx := txBytes(t, ctx, victim)
	res := c.Hosts[0].W.Go(Request{Op: "broadcast", Ref: src, Refs: refsOf(slots), ChunkSize: 1 << 20, TimeoutMS: 120_000})
	inFlight(t, ctx, victim, tx, 4<<20, res) // it is forwarding
	killed := time.Now()
	victim.W.Kill()
	r := await(t, res, time.Minute)
	require.True(t, r.OK, "broadcast: %s", r.Error)
	record(t, "broadcast, reader host killed mid-broadcast", time.Since(killed), fmt.Sprintf("%d readers", len(r.Readers)))
	for i, o := range r.Readers {
		s := slots[i]
		if s.h == victim {
			assert.False(t, o.OK && o.Generation == 0, "reader %d", i)
			continue
		}
		require.True(t, o.OK, "reader %d on %s routed around the dead host: %s", i, s.h.ID, o.Error)
		w, err := s.h.W.Call(ctx, Request{Op: "wait", Ref: s.ref, Seed: 3, TimeoutMS: 10_000})
		require.NoError(t, err)
		assert.True(t, w.OK && w.Verified, "reader %d: %s", i, w.Error)
	}
}

// An owner killed mid-broadcast: every reader's wait ends with owner_died
// (none hangs), and once the slots close every reserved byte is back.
func TestBroadcastOwnerKilled(t *testing.T) {
	c := New(t, Options{Hosts: 4})
	ctx := testCtx(t, 3*time.Minute)
	shapeAll(t, ctx, c, "400mbit")
	const size = 48 << 20
	readers := c.Hosts[1:]
	base := map[*Host]int64{}
	for _, h := range readers {
		base[h] = info(t, ctx, h.W).Used
	}
	src := put(t, ctx, c.Hosts[0].W, size, 5)
	slots := reserveSpread(t, ctx, readers, 6, size)
	owner := c.Hosts[0]
	tx := txBytes(t, ctx, owner)
	res := owner.W.Go(Request{Op: "broadcast", Ref: src, Refs: refsOf(slots), ChunkSize: 1 << 20, TimeoutMS: 120_000})
	var waits []<-chan Result
	for _, s := range slots {
		waits = append(waits, s.h.W.Go(Request{Op: "wait", Ref: s.ref, Seed: 5, TimeoutMS: 60_000}))
	}
	inFlight(t, ctx, owner, tx, 8<<20, res)
	killed := time.Now()
	owner.W.Kill()
	for i, ch := range waits {
		r := await(t, ch, 30*time.Second)
		if r.OK {
			continue // it completed before the owner died
		}
		assert.Equal(t, "owner_died", r.Code, "reader %d: %s", i, r.Error)
	}
	record(t, "broadcast, owner killed mid-broadcast", time.Since(killed), "every reader: owner_died")
	for _, s := range slots {
		r, err := s.h.W.Call(ctx, Request{Op: "close-slot", Ref: s.ref})
		require.NoError(t, err)
		require.True(t, r.OK, r.Error)
	}
	for _, h := range readers {
		backToBaseline(t, ctx, h.W, base[h], 10*time.Second)
	}
}

// ghostRef is ref with another object id: a slot nobody reserved, on a
// live reader.
func ghostRef(t *testing.T, ref string) string {
	t.Helper()
	p, err := base64.StdEncoding.DecodeString(ref)
	require.NoError(t, err)
	r, err := rdt.ParseRef(p)
	require.NoError(t, err)
	r.Object[0] ^= 0xff
	p, err = r.MarshalBinary()
	require.NoError(t, err)
	return base64.StdEncoding.EncodeToString(p)
}

// Readers that misbehave across processes: one names a slot it never
// reserved (it fails not_found at once, the others complete), and one
// leaves mid-step, closing its slot while it is forwarding to the next
// host: its orphans are re-parented, every other reader completes with
// verified bytes, and the leaver's memory comes back.
func TestBroadcastReaderFaults(t *testing.T) {
	c := New(t, Options{Hosts: 4})
	ctx := testCtx(t, 3*time.Minute)
	shapeAll(t, ctx, c, "400mbit")
	const size = 48 << 20
	src := put(t, ctx, c.Hosts[0].W, size, 9)
	slots := reserveSpread(t, ctx, c.Hosts[1:], 6, size) // h1, h2, h3 GPU 0, then GPU 1
	verify := func(i int, after uint64) {
		s := slots[i]
		w, err := s.h.W.Call(ctx, Request{Op: "wait", Ref: s.ref, Seed: 9, After: after, TimeoutMS: 10_000})
		require.NoError(t, err)
		assert.True(t, w.OK && w.Verified, "reader %d: %s", i, w.Error)
	}

	// A reader that never reserved.
	refs := append(refsOf(slots), ghostRef(t, slots[1].ref))
	r, err := c.Hosts[0].W.Call(ctx, Request{Op: "broadcast", Ref: src, Refs: refs, ChunkSize: 1 << 20, TimeoutMS: 120_000})
	require.NoError(t, err)
	require.True(t, r.OK, "broadcast: %s", r.Error)
	require.Len(t, r.Readers, len(slots)+1)
	ghost := r.Readers[len(slots)]
	assert.False(t, ghost.OK)
	assert.Equal(t, "object_not_found", ghost.Code, ghost.Error)
	for i := range slots {
		require.True(t, r.Readers[i].OK, "reader %d: %s", i, r.Readers[i].Error)
		verify(i, 0)
	}

	// A reader that leaves mid-step: h2's leader (fed by h1's, feeding
	// h3's) closes its slot while it forwards.
	leaver := slots[1]
	base := info(t, ctx, leaver.h.W).Used
	tx := txBytes(t, ctx, leaver.h)
	res := c.Hosts[0].W.Go(Request{Op: "broadcast", Ref: src, Refs: refsOf(slots), ChunkSize: 1 << 20, TimeoutMS: 120_000})
	inFlight(t, ctx, leaver.h, tx, 4<<20, res)
	cr, err := leaver.h.W.Call(ctx, Request{Op: "close-slot", Ref: leaver.ref})
	require.NoError(t, err)
	require.True(t, cr.OK, cr.Error)
	r = await(t, res, time.Minute).Reply
	require.True(t, r.OK, "broadcast: %s", r.Error)
	t.Logf("tree:\n%s", r.Tree)
	for i, o := range r.Readers {
		if i == 1 {
			assert.False(t, o.OK && o.Generation == 0, "the leaver")
			continue
		}
		require.True(t, o.OK, "reader %d routed around the leaver: %s", i, o.Error)
		verify(i, 1)
	}
	backToBaseline(t, ctx, leaver.h.W, base-size, 10*time.Second)
}
