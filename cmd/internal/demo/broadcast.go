package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tensorlane/tensorlane/rdt"
)

// demo --broadcast: RL weight sync the way a fleet does it. Each reader
// reserves one flow-controlled slot per weight tensor and sends the slots'
// refs to the trainer; every step the trainer updates its weights and
// broadcasts them to all readers at once (a pipelined tree across hosts),
// each reader verifies every byte and says Done with the generation, and
// the trainer waits for all of them before the next step.

// BroadcastStep is one step of RunBroadcast: how many readers verified the
// new generation of every tensor, and how long the broadcast took.
type BroadcastStep struct {
	Step     int     `json:"step"`
	Readers  int     `json:"readers"`
	OK       int     `json:"ok"`
	Bytes    int64   `json:"bytes"` // per reader
	Seconds  float64 `json:"seconds"`
	Verified bool    `json:"verified"`
}

// BroadcastResult is what RunBroadcast reports; Tree is ExplainBroadcast's
// tree of the first tensor.
type BroadcastResult struct {
	OK        bool            `json:"ok"`
	Simulated bool            `json:"simulated"`
	Preset    string          `json:"preset"`
	Hosts     int             `json:"hosts"`
	Tree      string          `json:"tree"`
	Steps     []BroadcastStep `json:"steps"`
}

// RunBroadcast runs cfg.Steps steps of weight sync by broadcast on a new
// rig. An error means the demo could not run or a step failed; a reader
// that got wrong bytes shows in BroadcastResult.OK.
func RunBroadcast(ctx context.Context, cfg Config) (*BroadcastResult, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	o := cfg.withDefaults()
	rig, err := NewRig(ctx, o)
	if err != nil {
		return nil, err
	}
	defer rig.Close()
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
			s, err := rd.Actor.Reserve(ctx, ref.Desc, rd.Device, rdt.WithGenerations())
			if err != nil {
				return nil, fmt.Errorf("%s: reserve: %w", rd.Actor.Name(), err)
			}
			slots[i] = append(slots[i], s)
			refs = append(refs, s.Ref())
		}
		if err := rd.Actor.Send(ctx, rig.trainer.Addr(), rdt.Message{Payload: []byte("slots"), Refs: refs}); err != nil {
			return nil, err
		}
	}
	// The trainer collects them: per reader, its slot per tensor.
	var perReader [][]rdt.Ref
	for range rig.readers {
		m, err := rig.trainer.Receive(ctx)
		if err != nil {
			return nil, err
		}
		if len(m.Refs) != len(rig.refs) {
			return nil, fmt.Errorf("reader %s sent %d slots for %d tensors", m.From, len(m.Refs), len(rig.refs))
		}
		perReader = append(perReader, m.Refs)
	}
	firsts := make([]rdt.Ref, len(perReader))
	for j, rs := range perReader {
		firsts[j] = rs[0]
	}
	res := &BroadcastResult{OK: true, Simulated: rig.simulated, Preset: o.Preset, Hosts: o.Hosts,
		Tree: rig.trainer.ExplainBroadcast(rig.refs[0], firsts).String()}
	for step := 1; step <= o.Steps; step++ {
		// A training step changed the weights.
		for i := range rig.refs {
			if err := demoWeights(rig, i, i+256*step); err != nil {
				return nil, err
			}
		}
		start := time.Now()
		// The whole state dict along one tree, one setup round per reader.
		result, err := rig.trainer.BroadcastBatch(ctx, rig.refs, perReader, rdt.BroadcastConfig{})
		st := BroadcastStep{Step: step, Readers: len(rig.readers), Bytes: int64(len(rig.refs)) * rig.size, Seconds: time.Since(start).Seconds(), Verified: true}
		if err == nil {
			err = errors.Join(append(result.Items, result.Err())...)
		}
		if err != nil {
			return nil, fmt.Errorf("step %d: %w", step, err)
		}
		// Every reader checks every byte of the new generation, then says
		// it is done with it.
		for r := range rig.readers {
			ok := true
			for i, s := range slots[r] {
				gen, x, err := s.Wait(ctx, uint64(step-1))
				if err != nil {
					return nil, err
				}
				p, _ := x.SpanBytes()
				pattern(rig.want, i+256*step)
				ok = ok && bytes.Equal(p, rig.want)
				if err := s.Done(ctx, gen); err != nil {
					return nil, err
				}
			}
			if ok {
				st.OK++
			}
			st.Verified = st.Verified && ok
		}
		if err := result.WaitConsumed(ctx); err != nil {
			return nil, err
		}
		res.OK = res.OK && st.Verified
		res.Steps = append(res.Steps, st)
	}
	return res, nil
}

// demoWeights rewrites the trainer's tensor i with pattern k (the owner
// writes its own memory; readers see it only through the broadcast).
func demoWeights(rig *Rig, i, k int) error {
	p, err := rig.tensors[i].SpanBytes()
	if err != nil {
		return err
	}
	pattern(p, k)
	return nil
}
