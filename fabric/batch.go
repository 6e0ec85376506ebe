package fabric

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/tensor"
)

// Batches. A state dict is hundreds of objects of one owner; read one by
// one, each pays the owner's round trips (a request and its first byte over
// tcp, a registration exchange over rdma) even when its bytes take
// microseconds. A transport that can move many objects of one owner
// together implements BatchReader; the planner hands it every item of a
// batch whose best path it is, grouped per owner, and reads the rest (and
// any item the batch path failed for a passing reason) one by one, with
// the usual retries and fallback.

// BatchReader is the optional capability of transports that move many
// objects together: tcp pipelines the requests of one owner on its
// connections, rdma resolves every object of one owner in one control
// round trip before posting the reads, shm and p2p grant every object of
// one owner in one request and reply before copying them.
type BatchReader interface {
	// ReadBatch pulls srcs[i] into dsts[i] for every i and returns each
	// item's Stats and error; both slices have len(srcs) entries. Items
	// succeed or fail on their own: a freed, unknown or forged object
	// fails its item and no other. The sources may belong to several
	// owners. When ctx ends, items not complete fail with its error. As
	// with Read, a failed item's destination is undefined.
	ReadBatch(ctx context.Context, srcs []Remote, dsts []tensor.Buffer) ([]Stats, []error)
}

// CheckBatch returns per-item errors for arguments a ReadBatch cannot run
// on at all (mismatched lengths), or nil.
func CheckBatch(srcs []Remote, dsts []tensor.Buffer) []error {
	return checkLengths(len(srcs), len(dsts), len(srcs), "destinations")
}

// checkLengths fails each of items when a batch has srcs sources and dsts
// destinations (what names them) and the two differ, or returns nil.
func checkLengths(srcs, dsts, items int, what string) []error {
	if srcs == dsts {
		return nil
	}
	errs := make([]error, items)
	for i := range errs {
		errs[i] = fmt.Errorf("%w: batch of %d sources and %d %s", ErrBadRequest, srcs, dsts, what)
	}
	return errs
}

// Coalesces reports whether ReadBatch would coalesce a plan's transfer with
// others of the same owner (its chosen transport is a BatchReader).
func (p Plan) Coalesces() bool {
	_, ok := p.ChosenTransport().(BatchReader)
	return ok
}

// BatchResult is one item's outcome of Planner.ReadBatch.
type BatchResult struct {
	Stats Stats
	Plan  Plan
	Err   error
}

// ReadBatch moves srcs[i] into bufs[i], every one of which lives at dst.
// Items whose chosen transport is a BatchReader are coalesced: one
// ReadBatch per (transport, owner) with two items or more. An item that
// fails there for a reason another try might not repeat is read again on
// its own (Read: retries, then fallback, logged and counted); items of
// other transports are read with Read, parallel at a time (default 4).
func (p *Planner) ReadBatch(ctx context.Context, srcs []Remote, dst Endpoint, bufs []tensor.Buffer, parallel int) []BatchResult {
	res := make([]BatchResult, len(srcs))
	if errs := CheckBatch(srcs, bufs); errs != nil {
		for i, err := range errs {
			res[i].Err = err
		}
		return res
	}
	for i, src := range srcs {
		res[i].Plan = p.PlanRead(src, dst)
		res[i].Plan.ZeroCopy = false // the caller gave the memory: always a copy
	}
	p.runBatch(ctx, res, parallel, batchOps{
		peer:      func(i int) string { return srcs[i].Peer },
		object:    func(i int) ObjectID { return srcs[i].Claim.Object },
		coalesces: Plan.Coalesces,
		together: func(t Transport, idx []int) ([]Stats, []error) {
			s := make([]Remote, len(idx))
			b := make([]tensor.Buffer, len(idx))
			for k, i := range idx {
				s[k], b[k] = srcs[i], bufs[i]
			}
			return t.(BatchReader).ReadBatch(ctx, s, b)
		},
		alone: func(i int) (Stats, Plan, error) { return p.Read(ctx, srcs[i], dst, bufs[i]) },
	})
	return res
}

// batchOps is what runBatch needs to know of a batch's direction (reads
// or pushes): the other side's peer and the object of item i, whether a
// plan's transport moves many items together, how to move a group of
// items together on one transport, and how to move one item on its own
// (with the planner's retries and fallback).
type batchOps struct {
	peer      func(i int) string
	object    func(i int) ObjectID
	coalesces func(Plan) bool
	together  func(t Transport, idx []int) ([]Stats, []error)
	alone     func(i int) (Stats, Plan, error)
}

// runBatch moves the items of a batch whose plans are in res: one
// coalesced call per (transport, peer) with two items or more, the rest
// (and the items a coalesced call failed for a passing reason) on their
// own, parallel at a time (default 4).
func (p *Planner) runBatch(ctx context.Context, res []BatchResult, parallel int, ops batchOps) {
	if parallel <= 0 {
		parallel = 4
	}
	type groupKey struct {
		t    Transport
		peer string
	}
	groups := map[groupKey][]int{}
	var order []groupKey
	var single []int
	for i := range res {
		if !ops.coalesces(res[i].Plan) {
			single = append(single, i)
			continue
		}
		k := groupKey{res[i].Plan.ChosenTransport(), ops.peer(i)}
		if groups[k] == nil {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	moveAlone := func(i int) {
		defer wg.Done()
		sem <- struct{}{}
		defer func() { <-sem }()
		st, plan, err := ops.alone(i)
		res[i] = BatchResult{Stats: st, Plan: plan, Err: err}
	}
	for _, k := range order {
		idx := groups[k]
		if len(idx) < 2 {
			single = append(single, idx...)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			retry := p.coalesce(ctx, k.t, idx, res, ops)
			for _, i := range retry {
				wg.Add(1)
				go moveAlone(i)
			}
		}()
	}
	for _, i := range single {
		wg.Add(1)
		go moveAlone(i)
	}
	wg.Wait()
}

// coalesce moves the items idx of one peer together on t, fills in their
// results and returns the items worth moving again on their own.
func (p *Planner) coalesce(ctx context.Context, t Transport, idx []int, res []BatchResult, ops batchOps) (retry []int) {
	name := t.Name()
	plan := res[idx[0]].Plan
	if quality(name, plan.Src, plan.Dst) > quality(plan.Best, plan.Src, plan.Dst) {
		p.warnDegraded(plan.Best, name, plan.Path, plan.Src, plan.Dst)
	}
	start := time.Now()
	sts, errs := ops.together(t, idx)
	d := time.Since(start)
	m := p.cfg.Metrics
	for k, i := range idx {
		err := errs[k]
		if err == nil {
			res[i].Stats = sts[k]
			if m != nil {
				m.Coalesced.WithLabelValues(name).Inc()
				if plan := res[i].Plan; quality(name, plan.Src, plan.Dst) > quality(plan.Best, plan.Src, plan.Dst) {
					m.Degraded.WithLabelValues(plan.Best, name).Inc()
				}
			}
			p.count(name, sts[k], sts[k].Duration, nil)
			continue
		}
		p.count(name, Stats{}, d, err)
		if Terminal(err) || ctx.Err() != nil {
			res[i].Err = &PathError{Transport: name, Attempt: 1, Err: err}
			continue
		}
		p.log.Info("batch item failed on its coalesced path; moving it on its own", "transport", name, "object", ops.object(i), "err", err)
		if m != nil {
			m.Retries.WithLabelValues(name).Inc()
		}
		retry = append(retry, i)
	}
	return retry
}
