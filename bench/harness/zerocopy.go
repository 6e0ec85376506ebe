package harness

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/tensorlane/tensorlane/internal/pcopy"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// PathZeroCopy measures on-host reads between two runtimes claiming one
// host (two processes to the planner): a zero-copy View, a cold Get into
// fresh reader memory, a warm Get (GetInto a reused buffer), and memcpy
// with one and with all cores, per size.
const PathZeroCopy = "zerocopy"

// ZeroCopyRecord is one size.
type ZeroCopyRecord struct {
	Path             string  `json:"path"` // "zerocopy"
	Size             int64   `json:"size"`
	ViewSeconds      float64 `json:"view_seconds"`       // Actor.View: map, no copy
	FirstViewSeconds float64 `json:"first_view_seconds"` // the first: the owner exports, the reader maps
	ColdSeconds      float64 `json:"cold_get_seconds"`
	WarmSeconds      float64 `json:"warm_get_seconds"` // GetInto a buffer used before
	ColdOverWarm     float64 `json:"cold_over_warm"`
	Memcpy1          float64 `json:"memcpy_1core_seconds"`
	MemcpyN          float64 `json:"memcpy_ncores_seconds"` // internal/pcopy, every core
	Cores            int     `json:"cores"`
	Transport        string  `json:"transport"` // of the Gets (p2p: NVLink-linked GPUs of the two runtimes)
}

// RunZeroCopy measures sizes (default 64 MiB, 256 MiB, 1 GiB), median of
// rounds (default 5).
func RunZeroCopy(ctx context.Context, sizes []int64, rounds int) (out []ZeroCopyRecord, err error) {
	if sizes == nil {
		sizes = []int64{64 << 20, 256 << 20, 1 << 30}
	}
	if rounds <= 0 {
		rounds = 5
	}
	cl, err := topology.Preset("dgx-h100", 1)
	if err != nil {
		return nil, err
	}
	maxSize := int64(0)
	for _, s := range sizes {
		maxSize = max(maxSize, s)
	}
	var rts []*rdt.Runtime
	defer func() {
		for _, r := range rts {
			if cerr := r.Shutdown(context.Background()); err == nil {
				err = cerr
			}
		}
	}()
	for range 2 {
		r, err := rdt.New(ctx, rdt.Config{Cluster: cl, Host: "h0", IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir(), DeviceMemory: 2*maxSize + 64<<20})
		if err != nil {
			return nil, err
		}
		rts = append(rts, r)
	}
	if err := rts[1].Connect(ctx, rts[0].AddrInfo()); err != nil {
		return nil, err
	}
	owner, err := rts[0].Spawn("trainer")
	if err != nil {
		return nil, err
	}
	reader, err := rts[1].Spawn("engine")
	if err != nil {
		return nil, err
	}
	mem, err := rts[0].Memory(srcDev)
	if err != nil {
		return nil, err
	}
	cores := pcopyCores()
	for _, size := range sizes {
		x, err := tensor.Alloc(ctx, mem, tensor.Uint8, size)
		if err != nil {
			return out, err
		}
		p, _ := x.SpanBytes()
		fillPattern(p)
		ref, err := owner.Put(ctx, x)
		if err != nil {
			x.Release()
			return out, err
		}
		rec := ZeroCopyRecord{Path: PathZeroCopy, Size: size, Cores: cores}
		var view, cold, warm, m1, mn []float64
		scratch := make([]byte, size)
		// Views first, one after another: the first maps, the others
		// reuse the reader's cached mapping under a fresh grant each.
		for i := range rounds + 1 {
			start := time.Now()
			v, err := reader.View(ctx, ref)
			if err != nil {
				return out, err
			}
			d := time.Since(start).Seconds()
			v.Release()
			if i == 0 {
				rec.FirstViewSeconds = d
				continue
			}
			view = append(view, d)
		}
		for range rounds {
			start := time.Now()
			t, xf, err := reader.Fetch(ctx, ref, nearDev) // fresh memory: pages populated on the way
			if err != nil {
				return out, err
			}
			cold = append(cold, time.Since(start).Seconds())
			rec.Transport = xf.Stats.Transport
			start = time.Now()
			if _, err := reader.GetInto(ctx, ref, t); err != nil { // the same buffer again
				t.Release()
				return out, err
			}
			warm = append(warm, time.Since(start).Seconds())
			t.Release()

			start = time.Now()
			copy(scratch, p)
			m1 = append(m1, time.Since(start).Seconds())
			start = time.Now()
			if err := pcopy.Copy(ctx, scratch, p, pcopy.Options{}); err != nil {
				return out, err
			}
			mn = append(mn, time.Since(start).Seconds())
		}
		rec.ViewSeconds, rec.ColdSeconds, rec.WarmSeconds = median(view), median(cold), median(warm)
		rec.Memcpy1, rec.MemcpyN = median(m1), median(mn)
		if rec.WarmSeconds > 0 {
			rec.ColdOverWarm = rec.ColdSeconds / rec.WarmSeconds
		}
		out = append(out, rec)
		if err := owner.Free(ctx, ref); err != nil {
			return out, fmt.Errorf("harness: free: %w", err)
		}
	}
	return out, nil
}

func pcopyCores() int { return min(runtime.GOMAXPROCS(0), 8) }
