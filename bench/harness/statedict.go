package harness

import (
	"context"
	"fmt"
	"time"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// PathStateDict measures a state dict fetched as one batch against one
// tensor of the same total size, over the path between two hosts.
const PathStateDict = "statedict"

// StateDictShape returns the bf16 tensor sizes (elements) of a transformer
// of about 1B parameters (TinyLlama-like: hidden 2048, 22 layers, MLP 5632,
// grouped-query k/v of 256, a 64000-token embedding tied with the head):
// 200 tensors, 2.05 GiB, the largest 250 MiB. scale divides every size
// (1: full), so a smaller machine can run the same shape.
func StateDictShape(scale int) []int64 {
	if scale < 1 {
		scale = 1
	}
	const hidden, inter, kv, layers, vocab = 2048, 5632, 256, 22, 64000
	out := []int64{vocab * hidden}
	for range layers {
		out = append(out,
			hidden*hidden, kv*hidden, kv*hidden, hidden*hidden, // q k v o
			inter*hidden, inter*hidden, hidden*inter, // gate up down
			hidden, hidden) // two norms
	}
	out = append(out, hidden) // final norm
	for i := range out {
		out[i] = max(4, out[i]/int64(scale)/4*4)
	}
	return out
}

// StateDictConfig selects the measurement; zero values mean the defaults.
type StateDictConfig struct {
	Scale     int    // divides every tensor size; default 1 (2.05 GiB)
	Transport string // between the two hosts: rdma (default) or tcp; on one host: p2p or shm
	Rounds    int    // interleaved rounds, median kept; default 3
	Parallel  int    // GetBatch's transfers at once (0: rdt's default)
	// Shape is the state dict: "1b" (default, StateDictShape) or "small"
	// (SmallShape: many small tensors, where per-object costs dominate).
	Shape string
	// Push measures the trainer pushing the state dict into slots the
	// reader reserved (PushBatch, statedictpush.go) instead of the reader
	// fetching it (GetBatch).
	Push bool
}

// SmallShape is 1000 bf16 tensors of 64 KiB each (62.5 MiB), divided by
// scale like StateDictShape: the case where per-object round trips, not
// bytes, set the time, and coalescing transfers per path matters most.
func SmallShape(scale int) []int64 {
	if scale < 1 {
		scale = 1
	}
	out := make([]int64, 1000)
	for i := range out {
		out[i] = max(4, 32<<10/int64(scale)/4*4)
	}
	return out
}

// StateDictRecord is the result.
type StateDictRecord struct {
	Path         string  `json:"path"` // "statedict"
	Mode         string  `json:"mode"` // "get" (GetBatch) or "push" (PushBatch)
	Shape        string  `json:"shape"`
	Transport    string  `json:"transport"`
	Tensors      int     `json:"tensors"`
	Size         int64   `json:"size"` // total bytes
	Largest      int64   `json:"largest"`
	BatchSeconds float64 `json:"batch_seconds"`
	OneSeconds   float64 `json:"one_seconds"` // one tensor of the same total size
	Ratio        float64 `json:"ratio"`       // batch throughput over one tensor's
	// SeparateSeconds is the same batch with every object moved on its own
	// (BatchConfig.Separate: no coalescing per path), and Coalescing the
	// batch's speed-up over it; both measured in the same rounds.
	SeparateSeconds float64 `json:"separate_seconds"`
	SeparateRatio   float64 `json:"separate_ratio"` // separate batch throughput over one tensor's
	Coalescing      float64 `json:"coalescing"`     // separate_seconds / batch_seconds
}

// RunStateDict measures a state dict Get as one batch (GetBatch) against
// a Get of one tensor of the same total size, interleaved round by round,
// on two simulated dgx-h100 hosts in this process.
func RunStateDict(ctx context.Context, cfg StateDictConfig) (rec StateDictRecord, err error) {
	if cfg.Scale <= 0 {
		cfg.Scale = 1
	}
	if cfg.Transport == "" {
		cfg.Transport = "rdma"
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 3
	}
	var shape []int64
	switch cfg.Shape {
	case "", "1b":
		cfg.Shape = "1b"
		shape = StateDictShape(cfg.Scale)
	case "small":
		shape = SmallShape(cfg.Scale)
	default:
		return StateDictRecord{}, fmt.Errorf("harness: statedict shape %q (want 1b or small)", cfg.Shape)
	}
	var total, largest int64
	for _, n := range shape {
		total += 2 * n
		largest = max(largest, 2*n)
	}
	rec = StateDictRecord{Path: PathStateDict, Mode: "get", Shape: cfg.Shape, Transport: cfg.Transport, Tensors: len(shape), Size: total, Largest: largest}
	if cfg.Push {
		rec.Mode = "push"
	}
	cl, err := topology.Preset("dgx-h100", 2)
	if err != nil {
		return rec, err
	}
	var rts []*rdt.Runtime
	defer func() {
		for _, r := range rts {
			if cerr := r.Shutdown(context.Background()); err == nil {
				err = cerr
			}
		}
	}()
	// The reader's destination: a GPU of the second host (rdma, tcp); on
	// the owner's host, in a second runtime (another process to the
	// planner), its NVLink-linked GPU (p2p) or host memory (shm).
	dstDev := srcDev
	for i := range 2 {
		c := rdt.Config{Cluster: cl, Host: cl.Hosts[i].ID, IgnoreEnv: true, DeviceMemory: 2*total + 64<<20, RuntimeDir: rdt.ProcessRuntimeDir()}
		switch cfg.Transport {
		case "tcp":
			c.Transports.Deny = []string{"rdma"}
		case "rdma":
		case "p2p":
			c.Host, dstDev = cl.Hosts[0].ID, nearDev
		case "shm":
			c.Host, dstDev = cl.Hosts[0].ID, tensor.HostDevice
		default:
			return rec, fmt.Errorf("harness: statedict transport %q (want rdma, tcp, p2p or shm)", cfg.Transport)
		}
		r, err := rdt.New(ctx, c)
		if err != nil {
			return rec, err
		}
		rts = append(rts, r)
	}
	if err := rts[1].Connect(ctx, rts[0].AddrInfo()); err != nil {
		return rec, err
	}
	owner, err := rts[0].Spawn("trainer")
	if err != nil {
		return rec, err
	}
	reader, err := rts[1].Spawn("worker")
	if err != nil {
		return rec, err
	}
	mem, err := rts[0].Memory(srcDev)
	if err != nil {
		return rec, err
	}
	put := func(elems int64) (rdt.Ref, error) {
		x, err := tensor.Alloc(ctx, mem, tensor.BFloat16, elems)
		if err != nil {
			return rdt.Ref{}, err
		}
		p, _ := x.SpanBytes()
		fillPattern(p)
		ref, err := owner.Put(ctx, x)
		if err != nil {
			x.Release()
		}
		return ref, err
	}
	var refs []rdt.Ref
	for _, n := range shape {
		ref, err := put(n)
		if err != nil {
			return rec, err
		}
		refs = append(refs, ref)
	}
	one, err := put(total / 2)
	if err != nil {
		return rec, err
	}
	if cfg.Push {
		return runStateDictPush(ctx, rec, cfg, owner, reader, refs, one, dstDev)
	}
	batch := func(separate bool) (float64, error) {
		start := time.Now()
		items, err := reader.GetBatch(ctx, refs, dstDev, rdt.BatchConfig{Parallel: cfg.Parallel, Separate: separate})
		if err != nil {
			return 0, err
		}
		d := time.Since(start).Seconds()
		defer rdt.ReleaseBatch(items)
		for i, it := range items {
			if it.Err != nil {
				return 0, fmt.Errorf("harness: statedict tensor %d: %w", i, it.Err)
			}
			if got := it.Transfer.Stats.Transport; got != cfg.Transport {
				return 0, fmt.Errorf("harness: statedict tensor %d moved over %s, not %s", i, got, cfg.Transport)
			}
		}
		return d, nil
	}
	single := func() (float64, error) {
		start := time.Now()
		x, err := reader.Get(ctx, one, dstDev)
		if err != nil {
			return 0, err
		}
		d := time.Since(start).Seconds()
		x.Release()
		return d, nil
	}
	return rec, rec.measure(cfg.Rounds, batch, single)
}

// measure times batch coalesced, batch separate and single, interleaved
// over rounds (after one warm-up round), and fills in the medians and
// ratios.
func (rec *StateDictRecord) measure(rounds int, batch func(separate bool) (float64, error), single func() (float64, error)) error {
	var bt, st, ot []float64
	for round := range rounds + 1 {
		// The order turns each round, so neither batch always runs right
		// after the other's memory was released.
		var d, ds float64
		var err error
		if round%2 == 0 {
			if d, err = batch(false); err == nil {
				ds, err = batch(true)
			}
		} else {
			if ds, err = batch(true); err == nil {
				d, err = batch(false)
			}
		}
		if err != nil {
			return err
		}
		d1, err := single()
		if err != nil {
			return err
		}
		if round > 0 { // round 0 warms both (page population of the arenas)
			bt, st, ot = append(bt, d), append(st, ds), append(ot, d1)
		}
	}
	rec.SeparateSeconds = median(st)
	rec.SeparateRatio = median(ot) / rec.SeparateSeconds
	rec.Coalescing = rec.SeparateSeconds / median(bt)
	rec.BatchSeconds, rec.OneSeconds = median(bt), median(ot)
	rec.Ratio = rec.OneSeconds / rec.BatchSeconds
	return nil
}
