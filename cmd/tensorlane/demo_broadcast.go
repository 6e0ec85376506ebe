package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/tensorlane/tensorlane/rdt"
)

// demo --broadcast: RL weight sync the way a fleet does it. Each reader
// reserves one flow-controlled slot per weight tensor and sends the slots'
// refs to the trainer; every step the trainer updates its weights and
// broadcasts them to all readers at once (a pipelined tree across hosts),
// each reader verifies every byte and says Done with the generation, and
// the trainer waits for all of them before the next step.

type demoBroadcastStep struct {
	Step     int     `json:"step"`
	Readers  int     `json:"readers"`
	OK       int     `json:"ok"`
	Bytes    int64   `json:"bytes"` // per reader
	Seconds  float64 `json:"seconds"`
	Verified bool    `json:"verified"`
}

type demoBroadcastResult struct {
	OK        bool                `json:"ok"`
	Simulated bool                `json:"simulated"`
	Preset    string              `json:"preset"`
	Hosts     int                 `json:"hosts"`
	Tree      string              `json:"tree"`
	Steps     []demoBroadcastStep `json:"steps"`
}

func runDemoBroadcast(ctx context.Context, out io.Writer, o demoOptions) error {
	if ctx == nil {
		ctx = context.Background()
	}
	rig, err := startDemoRig(ctx, o)
	if err != nil {
		return err
	}
	defer rig.close()
	// Each reader reserves its slots and sends their refs to the trainer.
	slots := make([][]*rdt.Slot, len(rig.readers))
	defer func() {
		for _, ss := range slots {
			for _, s := range ss {
				s.Close()
			}
		}
	}()
	for i, rd := range rig.readers {
		var refs []rdt.Ref
		for _, ref := range rig.refs {
			s, err := rd.actor.Reserve(ctx, ref.Desc, rd.dev, rdt.WithGenerations())
			if err != nil {
				return fmt.Errorf("%s: reserve: %w", rd.actor.Name(), err)
			}
			slots[i] = append(slots[i], s)
			refs = append(refs, s.Ref())
		}
		if err := rd.actor.Send(ctx, rig.trainer.Addr(), rdt.Message{Payload: []byte("slots"), Refs: refs}); err != nil {
			return err
		}
	}
	// The trainer collects them: per reader, its slot per tensor.
	var perReader [][]rdt.Ref
	for range rig.readers {
		m, err := rig.trainer.Receive(ctx)
		if err != nil {
			return err
		}
		if len(m.Refs) != len(rig.refs) {
			return fmt.Errorf("reader %s sent %d slots for %d tensors", m.From, len(m.Refs), len(rig.refs))
		}
		perReader = append(perReader, m.Refs)
	}
	firsts := make([]rdt.Ref, len(perReader))
	for j, rs := range perReader {
		firsts[j] = rs[0]
	}
	res := demoBroadcastResult{OK: true, Simulated: rig.simulated, Preset: o.preset, Hosts: o.hosts,
		Tree: rig.trainer.ExplainBroadcast(rig.refs[0], firsts).String()}
	for step := 1; step <= o.steps; step++ {
		// A training step changed the weights.
		for i := range rig.refs {
			if err := demoWeights(rig, i, i+256*step); err != nil {
				return err
			}
		}
		start := time.Now()
		// The whole state dict along one tree, one setup round per reader.
		result, err := rig.trainer.BroadcastBatch(ctx, rig.refs, perReader, rdt.BroadcastConfig{})
		st := demoBroadcastStep{Step: step, Readers: len(rig.readers), Bytes: int64(len(rig.refs)) * rig.size, Seconds: time.Since(start).Seconds(), Verified: true}
		if err == nil {
			err = errors.Join(append(result.Items, result.Err())...)
		}
		if err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		// Every reader checks every byte of the new generation, then says
		// it is done with it.
		for r := range rig.readers {
			ok := true
			for i, s := range slots[r] {
				gen, x, err := s.Wait(ctx, uint64(step-1))
				if err != nil {
					return err
				}
				p, _ := x.SpanBytes()
				pattern(rig.want, i+256*step)
				ok = ok && bytes.Equal(p, rig.want)
				if err := s.Done(ctx, gen); err != nil {
					return err
				}
			}
			if ok {
				st.OK++
			}
			st.Verified = st.Verified && ok
		}
		if err := result.WaitConsumed(ctx); err != nil {
			return err
		}
		res.OK = res.OK && st.Verified
		res.Steps = append(res.Steps, st)
	}
	if o.json {
		if err := json.NewEncoder(out).Encode(res); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(out, "tensorlane demo --broadcast: %d simulated %s hosts, %d bf16 tensors of %s, %d readers\n",
			o.hosts, o.preset, o.tensors, o.size, o.readers)
		fmt.Fprintln(out, "(simulated devices: memfd-backed arenas, real copies; hosts talk over loopback)")
		fmt.Fprintf(out, "broadcast tree (the whole state dict follows it):\n%s", res.Tree)
		tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "step\treaders\tverified\tbytes/reader\tseconds\t")
		for _, s := range res.Steps {
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%.3f\t\n", s.Step, s.Readers, s.OK, s.Bytes, s.Seconds)
		}
		tw.Flush()
	}
	if !res.OK {
		return fmt.Errorf("verification failed")
	}
	return nil
}

// demoWeights rewrites the trainer's tensor i with pattern k (the owner
// writes its own memory; readers see it only through the broadcast).
func demoWeights(rig *demoRig, i, k int) error {
	p, err := rig.tensors[i].SpanBytes()
	if err != nil {
		return err
	}
	pattern(p, k)
	return nil
}
