package fabric

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/tensorlane/tensorlane/tensor"
)

// Run is one contiguous range of an object's bytes: Len bytes from Off.
// A gathered push (GatherWriter, Planner.WriteRuns) sends the
// concatenation of its runs, in order.
type Run struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}

// ErrBadRuns is a run list that does not describe a push: a run outside
// the source, a run of no bytes, an overflowing range, or runs whose
// lengths do not add up to the destination's. It matches ErrBadRequest
// too, so no other path is tried.
var ErrBadRuns = fmt.Errorf("%w: bad runs", ErrBadRequest)

// CheckRuns validates runs over a source of size bytes that must fill a
// destination of want bytes exactly: every run non-empty and inside
// [0, size), their lengths adding up to want, no sum overflowing. Runs may
// overlap and come in any order (a reader may need a byte twice).
func CheckRuns(runs []Run, size, want int64) error {
	if len(runs) == 0 {
		return fmt.Errorf("%w: no runs", ErrBadRuns)
	}
	var total int64
	for i, r := range runs {
		if r.Off < 0 || r.Len <= 0 || r.Off > size || r.Len > size-r.Off {
			return fmt.Errorf("%w: run %d [%d,+%d) outside a source of %d bytes", ErrBadRuns, i, r.Off, r.Len, size)
		}
		if r.Len > want-total {
			return fmt.Errorf("%w: runs longer than the destination's %d bytes (at run %d)", ErrBadRuns, want, i)
		}
		total += r.Len
	}
	if total != want {
		return fmt.Errorf("%w: runs of %d bytes for a destination of %d", ErrBadRuns, total, want)
	}
	return nil
}

// RunsBytes is the sum of the runs' lengths.
func RunsBytes(runs []Run) int64 {
	var n int64
	for _, r := range runs {
		n += r.Len
	}
	return n
}

// GatherWriter is the optional capability of transports that push an
// object's runs straight from its memory, with no packed copy of them
// (fabric/tcp: each block of the wire sent from the object, or gathered
// into a cache-resident scratch block when it spans runs; fabric/rdma:
// WRITEs whose scatter-gather lists are the runs' pieces, from the object
// registered as it is; fabric/shm: the runs copied from the object into
// the sink's mapped pages): the sink sees dst.Length bytes, the runs'
// concatenation, exactly as if Writer.Write had sent a packed buffer of
// them. runs were validated (CheckRuns against src.Len() and dst.Length).
// The planner calls it with host-visible src only; it packs device memory
// as for a transport without the capability.
type GatherWriter interface {
	WriteRuns(ctx context.Context, src tensor.Buffer, runs []Run, dst Remote) (Stats, error)
}

// RunsSource is the check every GatherWriter makes first: runs describe a
// push of src into dst (CheckRuns), and src is host memory (the planner
// packs device memory), whose bytes it returns. transport names the path
// in the error.
func RunsSource(transport string, src tensor.Buffer, runs []Run, dst Remote) ([]byte, error) {
	if err := CheckRuns(runs, src.Len(), dst.Length); err != nil {
		return nil, err
	}
	if tensor.IsDevice(src) {
		return nil, fmt.Errorf("%w: %s sends runs of host memory only (the planner packs device memory)", ErrBadRequest, transport)
	}
	return tensor.BytesOf(src)
}

// PackRuns copies runs of src, in order, into dst from its start (the
// fallback of a gathered push on a path without GatherWriter).
func PackRuns(ctx context.Context, dst, src tensor.Buffer, runs []Run) error {
	var at int64
	for _, r := range runs {
		if err := tensor.Copy(ctx, dst, at, src, r.Off, r.Len); err != nil {
			return err
		}
		at += r.Len
	}
	return nil
}

// WriteRuns pushes the concatenation of runs of buf (an object of this
// runtime that lives at src) into the buffer dst names, on the best
// transport that can push, with Write's retries and fallback. A transport
// with GatherWriter sends the runs from buf itself; any other (and any
// device-memory buf) gets them packed first into a buffer from stage
// (memory at src, released after the write): a copy of every byte more,
// logged (a warning the first time per transport and pair of hosts) and
// counted (tensorlane_gather_packed_total{transport}).
func (p *Planner) WriteRuns(ctx context.Context, src Endpoint, buf tensor.Buffer, runs []Run, dst Remote, stage func(ctx context.Context, n int64) (tensor.Buffer, error)) (Stats, Plan, error) {
	if err := CheckRuns(runs, buf.Len(), dst.Length); err != nil {
		return Stats{}, p.PlanWrite(src, dst), err
	}
	plan := p.PlanWrite(src, dst)
	st, err := p.run(ctx, &plan, dst.Claim.Object, func(t Transport) (Stats, error) {
		if g, ok := t.(GatherWriter); ok && !tensor.IsDevice(buf) {
			return g.WriteRuns(ctx, buf, runs, dst)
		}
		return p.packedWrite(ctx, t, src, buf, runs, dst, stage)
	})
	return st, plan, err
}

// packedWrite is a gathered push over t without GatherWriter: pack, write.
func (p *Planner) packedWrite(ctx context.Context, t Transport, src Endpoint, buf tensor.Buffer, runs []Run, dst Remote, stage func(ctx context.Context, n int64) (tensor.Buffer, error)) (Stats, error) {
	if stage == nil {
		return Stats{}, fmt.Errorf("%w: %s cannot send runs and no staging memory was given", ErrNoPath, t.Name())
	}
	key := "gather " + t.Name() + " " + src.Host + ">" + dst.Endpoint.Host
	level := slog.LevelDebug
	if _, seen := p.warned.LoadOrStore(key, true); !seen {
		level = slog.LevelWarn
	}
	p.log.Log(ctx, level, "gathered push packed into a staging buffer first (the path cannot send runs)",
		"transport", t.Name(), "runs", len(runs), "bytes", dst.Length, "device", tensor.IsDevice(buf), "src", src, "dst", dst.Endpoint)
	if p.cfg.Metrics != nil {
		p.cfg.Metrics.GatherPacked.WithLabelValues(t.Name()).Inc()
	}
	packed, err := stage(ctx, dst.Length)
	if err != nil {
		return Stats{}, err
	}
	defer packed.Release()
	if err := PackRuns(ctx, packed, buf, runs); err != nil {
		return Stats{}, err
	}
	w, ok := t.(Writer)
	if !ok {
		return Stats{}, errors.New("fabric: " + t.Name() + " cannot push")
	}
	return w.Write(ctx, packed, dst)
}
