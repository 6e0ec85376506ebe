package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tensorlane/tensorlane/bench/harness"
)

// broadcastOptions are bench's flags for the broadcast path.
type broadcastOptions struct {
	readers    []int
	transports []string
	hosts      int
	rounds     int
	naive      bool
	chunk      string
	scale      int
	shapes     []string
	push       bool
}

func (b *broadcastOptions) flags(f *pflag.FlagSet) {
	f.IntSliceVar(&b.readers, "readers", nil, "with --paths broadcast: reader counts (default 1,2,4,8,16)")
	f.StringSliceVar(&b.transports, "broadcast-transports", nil, "with --paths broadcast: transports between hosts (default rdma,tcp)")
	f.IntVar(&b.hosts, "hosts", 0, "with --paths broadcast: simulated hosts (default 4)")
	f.IntVar(&b.rounds, "rounds", 0, "with --paths broadcast: timed rounds per cell, median kept (default 3)")
	f.StringVar(&b.chunk, "chunk", "", "with --paths broadcast: the pipelining chunk (default rdt's, 4MiB)")
	f.StringSliceVar(&b.shapes, "statedict-shapes", nil, "with --paths statedict: the state dicts to fetch: 1b (200 tensors, 2.05 GiB), small (1000 x 64 KiB); default 1b")
	f.BoolVar(&b.push, "statedict-push", false, "with --paths statedict: the trainer pushes the state dict into slots the reader reserved (one PushBatch, coalesced per path with one push notice, vs the same batch pushed item by item, vs one Push of the same size) instead of the reader fetching it")
	f.IntVar(&b.scale, "scale", 0, "with --paths statedict: divide every tensor of the 1B-parameter state dict by this (default 1: 2.05 GiB)")
	f.BoolVar(&b.naive, "naive", false, "with --paths broadcast: also time N pushes one after another (today's way)")
}

// takePath removes path from o.paths and reports whether it was there.
func takePath(o *benchOptions, path string) bool {
	i := slices.Index(o.paths, path)
	if i < 0 {
		return false
	}
	o.paths = slices.Delete(slices.Clone(o.paths), i, i+1)
	return true
}

func runBroadcastBench(cmd *cobra.Command, o benchOptions) error {
	out := cmd.OutOrStdout()
	cfg := harness.BroadcastConfig{Readers: o.bcast.readers, Transports: o.bcast.transports, Hosts: o.bcast.hosts, Rounds: o.bcast.rounds, Naive: o.bcast.naive}
	if o.bcast.chunk != "" {
		n, err := parseSize(o.bcast.chunk)
		if err != nil {
			return err
		}
		cfg.ChunkSize = n
	}
	for _, s := range o.sizes {
		n, err := parseSize(s)
		if err != nil {
			return err
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	if o.quick {
		if cfg.Readers == nil {
			cfg.Readers = []int{1, 4}
		}
		if cfg.Sizes == nil {
			cfg.Sizes = []int64{16 << 20}
		}
		if cfg.Rounds == 0 {
			cfg.Rounds = 1
		}
	}
	var show func(harness.BroadcastRecord)
	if o.json {
		show = func(r harness.BroadcastRecord) { harness.WriteBroadcastJSON(out, []harness.BroadcastRecord{r}) }
	}
	recs, err := harness.RunBroadcast(cmd.Context(), cfg, show)
	if err != nil {
		return err
	}
	if !o.json {
		fmt.Fprintln(out, "broadcast (simulated hosts in this process; ratio = time for N readers / time for 1):")
		if err := harness.WriteBroadcastTable(out, recs); err != nil {
			return err
		}
	}
	if o.out != "" {
		files, err := harness.WriteBroadcastReport(o.out, recs)
		if err != nil {
			return err
		}
		if !o.json {
			fmt.Fprintf(out, "wrote %s\n", strings.Join(files, ", "))
		}
	}
	return nil
}

func runStateDictBench(cmd *cobra.Command, o benchOptions) error {
	out := cmd.OutOrStdout()
	trs := o.bcast.transports
	if trs == nil {
		trs = []string{"rdma"}
	}
	shapes := o.bcast.shapes
	if shapes == nil {
		shapes = []string{"1b"}
	}
	for _, shape := range shapes {
		for _, tr := range trs {
			rec, err := harness.RunStateDict(cmd.Context(), harness.StateDictConfig{Scale: o.bcast.scale, Transport: tr, Rounds: o.bcast.rounds, Shape: shape, Push: o.bcast.push})
			if err != nil {
				return err
			}
			if o.json {
				if err := json.NewEncoder(out).Encode(rec); err != nil {
					return err
				}
				continue
			}
			if o.bcast.push {
				fmt.Fprintf(out, "statedict push %s over %s: %d bf16 tensors, %s (largest %s) as one PushBatch %.3f s; item by item %.3f s (coalescing %.2f x); one tensor of the same size %.3f s; batch throughput %.2f x one tensor's\n",
					shape, tr, rec.Tensors, harness.SizeString(rec.Size), harness.SizeString(rec.Largest), rec.BatchSeconds, rec.SeparateSeconds, rec.Coalescing, rec.OneSeconds, rec.Ratio)
				continue
			}
			fmt.Fprintf(out, "statedict %s over %s: %d bf16 tensors, %s (largest %s) as one GetBatch %.3f s; one tensor of the same size %.3f s; batch throughput %.2f x one tensor's\n",
				shape, tr, rec.Tensors, harness.SizeString(rec.Size), harness.SizeString(rec.Largest), rec.BatchSeconds, rec.OneSeconds, rec.Ratio)
		}
	}
	return nil
}

func runZeroCopyBench(cmd *cobra.Command, o benchOptions) error {
	out := cmd.OutOrStdout()
	var sizes []int64
	for _, s := range o.sizes {
		n, err := parseSize(s)
		if err != nil {
			return err
		}
		sizes = append(sizes, n)
	}
	recs, err := harness.RunZeroCopy(cmd.Context(), sizes, o.bcast.rounds)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if o.json {
			if err := json.NewEncoder(out).Encode(r); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(out, "zerocopy %s (two runtimes on one host): view first %.4f s, then %.5f s; get cold %.3f s, warm %.3f s (cold/warm %.2f, %s); memcpy 1 core %.3f s, %d cores %.3f s (%.2fx)\n",
			harness.SizeString(r.Size), r.FirstViewSeconds, r.ViewSeconds, r.ColdSeconds, r.WarmSeconds, r.ColdOverWarm, r.Transport, r.Memcpy1, r.Cores, r.MemcpyN, r.Memcpy1/r.MemcpyN)
	}
	return nil
}
