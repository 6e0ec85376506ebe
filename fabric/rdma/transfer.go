package rdma

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/tensor"
)

// session is one resolved claim: the keys of the owner's registration on
// each of its NICs, and the rail whose queue pair the registration is tied
// to (the owner releases it when that queue pair goes away).
type session struct {
	id   uint64
	rail *rail
	qp   QueuePair
	keys map[string]regKey
	gen  int
}

// resolve runs the control exchange on the first rail that works.
func (t *Transport) resolve(ctx context.Context, rails []*rail, src fabric.Remote, push bool) (*session, error) {
	req := resolveReq{id: randomID(), push: push, claim: src.Claim, offset: src.Offset, length: src.Length}
	resp, r, qp, err := t.call(ctx, rails, src.Peer, req.marshal(), req.id)
	if err != nil {
		return nil, err
	}
	rr, err := decodeResolveResp(resp)
	if err != nil {
		t.sendDone(rails, r, qp, req.id)
		return nil, err
	}
	s := &session{id: req.id, rail: r, qp: qp, keys: map[string]regKey{}}
	for _, k := range rr.keys {
		s.keys[k.NIC] = k
	}
	return s, nil
}

// call sends a control message on the first rail that works and returns
// the reply and the rail and queue pair that carried it. ids are the
// registrations the message asks for: when the exchange is cut short, the
// owner is told to let go of them.
func (t *Transport) call(ctx context.Context, rails []*rail, owner string, msg []byte, ids ...uint64) ([]byte, *rail, QueuePair, error) {
	cctx := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, t.cfg.ControlTimeout)
		defer cancel()
	}
	var errs []error
	for _, r := range rails {
		// A rail gets as many connection attempts as it takes to pause it.
		for range t.cfg.PauseAfter + 1 {
			qp, err := t.waitReady(cctx, r)
			if errors.Is(err, errPaused) {
				r.mu.Lock()
				last := r.lastErr
				r.mu.Unlock()
				errs = append(errs, fmt.Errorf("rail %s paused after: %w", r.label, last))
				break
			}
			if err != nil {
				return nil, nil, nil, t.ctxErr(ctx, cctx, err)
			}
			resp, err := qp.Call(cctx, msg)
			if err == nil {
				return resp, r, qp, nil
			}
			var re *peerauth.RemoteError
			if errors.As(err, &re) {
				return nil, nil, nil, err // the owner's answer: typed by its status
			}
			if cctx.Err() != nil {
				// The owner may still resolve and pin: tell it to let go.
				t.sendDone(rails, r, qp, ids...)
				return nil, nil, nil, t.ctxErr(ctx, cctx, err)
			}
			errs = append(errs, fmt.Errorf("rail %s: %w", r.label, err))
			t.railFailed(r, qp, err)
		}
	}
	return nil, nil, nil, fmt.Errorf("%w: no rail to %s answers: %w", fabric.ErrPeerClosed, owner, errors.Join(errs...))
}

// ctxErr reports the caller's context error, or ErrStalled when only the
// control timeout expired.
func (t *Transport) ctxErr(ctx, cctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if cctx.Err() != nil {
		return fmt.Errorf("%w: control exchange took longer than %v", fabric.ErrStalled, t.cfg.ControlTimeout)
	}
	return err
}

// waitReady waits until the rail's queue pair is connected.
func (t *Transport) waitReady(ctx context.Context, r *rail) (QueuePair, error) {
	for {
		changed := t.changes()
		qp, err := t.ready(r)
		if qp != nil || err != nil {
			return qp, err
		}
		select {
		case <-changed:
		case <-t.base.Done():
			return nil, fabric.ErrClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// sendDone releases a registration on the owner, within a short bound
// that does not depend on the caller's (maybe cancelled) context. The
// owner accepts it on any queue pair of ours, so when the registration's
// own queue pair is broken (its rail was cut) another connected rail of
// the same owner carries it. If no rail can, closing the queue pair the
// registration is tied to releases it on the owner's side.
func (t *Transport) sendDone(rails []*rail, r *rail, qp QueuePair, ids ...uint64) {
	for len(ids) > maxBatch {
		t.sendDone(rails, r, qp, ids[:maxBatch]...)
		ids = ids[maxBatch:]
	}
	if len(ids) == 0 {
		return
	}
	msg := doneMsgs(ids)
	ctx, cancel := context.WithTimeout(t.base, 2*time.Second)
	defer cancel()
	_, err := qp.Call(ctx, msg)
	if err == nil {
		return
	}
	t.log.Debug("rdma done not delivered on its rail; closing that queue pair", "rail", r.label, "err", err)
	t.railFailed(r, qp, err)
	for _, other := range rails {
		if other == r || other.peer != r.peer {
			continue
		}
		if oqp, _ := t.ready(other); oqp != nil {
			if _, err := oqp.Call(ctx, msg); err == nil {
				return
			}
		}
	}
}

// releaseLater sends sendDone from a goroutine of the transport (Close
// waits for it); after Close, closing the queue pairs releases the
// owner's registrations instead.
func (t *Transport) releaseLater(rails []*rail, r *rail, qp QueuePair, ids ...uint64) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		t.sendDone(rails, r, qp, ids...)
	}()
}

// slice is one work request of a transfer: n bytes at off of the remote
// range, from local[off:] or, in a gathered push, from the pieces segs of
// local (offsets into it), in order.
type slice struct {
	off, n   int64
	segs     []fabric.Run
	attempts int
	avoid    *rail
}

// gatherSlices cuts a gathered push of runs of local into work requests:
// the destination range (the runs' concatenation) into slices of size
// bytes, as a plain push is cut, each filled by the pieces of runs that
// land in it; a slice of more than maxSGE pieces becomes several work
// requests of at most maxSGE. Runs that follow each other in local
// become one piece.
func gatherSlices(runs []fabric.Run, size int64, maxSGE int) []*slice {
	var out []*slice
	var cur *slice
	var pos int64 // destination offset
	for _, r := range runs {
		for r.Len > 0 {
			end := (pos/size + 1) * size // of the destination slice pos is in
			k := min(r.Len, end-pos)
			switch {
			case cur != nil && pos%size != 0 && cur.segs[len(cur.segs)-1].Off+cur.segs[len(cur.segs)-1].Len == r.Off:
				cur.segs[len(cur.segs)-1].Len += k
			case cur == nil || pos%size == 0 || len(cur.segs) == maxSGE:
				cur = &slice{off: pos}
				out = append(out, cur)
				fallthrough
			default:
				cur.segs = append(cur.segs, fabric.Run{Off: r.Off, Len: k})
			}
			cur.n += k
			pos += k
			r.Off += k
			r.Len -= k
		}
	}
	return out
}

type posted struct {
	s   *slice
	r   *rail
	qp  QueuePair
	gen int
	at  time.Time
}

// maxReresolve bounds how often a transfer re-registers after losing the
// queue pair its registration was tied to.
const maxReresolve = 3

// transfer moves len(local) bytes between local and the owner's object
// (READ) or sink (WRITE, push); with runs (a gathered push) it pushes
// their concatenation, src.Length bytes, from local instead.
func (t *Transport) transfer(ctx context.Context, src fabric.Remote, dev tensor.DeviceID, local []byte, runs []fabric.Run, push bool) (fabric.Stats, error) {
	start := time.Now()
	rails, _, err := t.railsFor(src, dev)
	if err != nil {
		return fabric.Stats{}, err
	}
	if runs != nil && !gathers(rails, runs, src.Length) {
		var done func()
		local, runs, done = t.pack(rails, local, runs, src)
		defer done() // after move: local is deregistered by then
	}
	if err := ctx.Err(); err != nil {
		return fabric.Stats{}, err
	}
	if src.Length > t.cfg.sliceSize(src.Length, len(rails)) {
		// Start connecting every rail now, so their handshakes overlap the
		// control exchange instead of a first large transfer running on
		// the one rail that resolved it.
		for _, r := range rails[1:] {
			t.ready(r)
		}
	}
	sess, err := t.resolve(ctx, rails, src, push)
	if err != nil {
		return fabric.Stats{}, err
	}
	// The owner's pin is released behind the transfer: its end does not
	// wait for another round trip.
	defer func() { t.releaseLater(rails, sess.rail, sess.qp, sess.id) }()
	return t.move(ctx, start, rails, sess, src, local, runs, push)
}

// minGatherWrite is the least a gathered push's WRITEs should carry on
// average; below it the push packs (pack). softrdma's WRITEs of 64 4 KiB
// pieces (256 KiB) beat packing (1.26-1.34x the unsharded step in
// BenchmarkReshard's gathered step against 1.46-1.51x); libfabric's net
// provider's of 4 (its iov_limit: 16 KiB) took 29x a plain push where
// packing took 1.7x (BenchmarkWriteRunsOFI): a WRITE's round trip, four in
// flight per rail, costs far more than copying 16 KiB.
const minGatherWrite = 256 << 10

// gathers says whether a push of runs (n bytes) over rails goes out as
// gathered WRITEs: every rail's device takes at least two segments per
// WRITE, and as many as it takes of runs of their mean length make
// minGatherWrite bytes (or the whole push).
func gathers(rails []*rail, runs []fabric.Run, n int64) bool {
	sge := int64(minSGE(rails))
	return sge >= 2 && sge*(n/int64(len(runs))) >= min(minGatherWrite, n)
}

// minSGE is the fewest segments per WRITE a rail of rails takes.
func minSGE(rails []*rail) int {
	n := 0
	for i, r := range rails {
		if i == 0 || r.local.maxSGE < n {
			n = r.local.maxSGE
		}
	}
	return n
}

// pack copies runs of local into a buffer, for rails whose devices take
// too few segments per WRITE for runs this short (gathers): a WRITE per
// few runs would cost a work request (and a completion) per few KiB.
// Logged (a warning the first time) and counted.
// done gives the buffer back for the next pack: with a fresh buffer each
// push (its page faults) a pack and push of 16 MiB took 1.77-1.79x a plain
// push (BenchmarkWriteRuns, sge=1, load 4.4), with a reused one as much as
// the benchmark's own pack and push (1.45-1.57x against 1.50-1.66x, load 7).
func (t *Transport) pack(rails []*rail, local []byte, runs []fabric.Run, dst fabric.Remote) (packed []byte, none []fabric.Run, done func()) {
	level := slog.LevelDebug
	if !t.packWarned.Swap(true) {
		level = slog.LevelWarn
	}
	t.log.Log(context.Background(), level, "rdma gathered push packed first (a rail's device takes too few segments per WRITE for runs this short)",
		"provider", t.cfg.Provider.Name(), "max_sge", minSGE(rails), "runs", len(runs), "bytes", dst.Length, "owner", dst.Peer)
	if m := t.cfg.Metrics; m != nil {
		m.GatherPacked.Inc()
	}
	bp, _ := packBufs.Get().(*[]byte)
	if bp == nil || int64(cap(*bp)) < dst.Length {
		b := make([]byte, dst.Length)
		bp = &b
	}
	out := (*bp)[:0]
	for _, r := range runs {
		out = append(out, local[r.Off:r.Off+r.Len]...)
	}
	return out, nil, func() { packBufs.Put(bp) }
}

// packBufs holds pack's buffers between pushes.
var packBufs sync.Pool

// move moves the bytes of a resolved claim: slices posted over every rail
// the owner registered on, failed slices moved to other rails. A
// registration lost with its queue pair is resolved again, in sess. With
// runs, a push sends their concatenation from local (gatherSlices).
func (t *Transport) move(ctx context.Context, start time.Time, rails []*rail, sess *session, src fabric.Remote, local []byte, runs []fabric.Run, push bool) (fabric.Stats, error) {
	stats := fabric.Stats{Transport: fabric.RDMA, Bytes: src.Length, Streams: 1}
	if src.Length == 0 {
		stats.Duration = time.Since(start)
		return stats, nil
	}

	var usable []*rail
	mrs := map[*localNIC]MemoryRegion{}
	defer func() {
		// After this no provider touches local: deregistration waits for
		// accesses in progress.
		for _, m := range mrs {
			m.Deregister()
		}
	}()
	for _, r := range rails {
		if _, ok := sess.keys[r.remote.NIC]; ok {
			usable = append(usable, r)
		}
	}
	if len(usable) == 0 {
		return fabric.Stats{}, fmt.Errorf("%w: the owner registered on no NIC this transport reaches", fabric.ErrNoPath)
	}
	// The local buffer is registered on a local NIC when a slice is first
	// posted through it: a small transfer uses one rail, and registers once.
	register := func(n *localNIC) (MemoryRegion, error) {
		if m := mrs[n]; m != nil {
			return m, nil
		}
		m, err := n.pd.RegisterMemory(local, AccessLocalWrite)
		if err != nil {
			return nil, fmt.Errorf("rdma: register the local buffer on %s: %w", n.name, err)
		}
		mrs[n] = m
		return m, nil
	}

	var queue []*slice
	sliceSize := t.cfg.sliceSize(src.Length, len(usable))
	if runs != nil {
		queue = gatherSlices(runs, sliceSize, minSGE(usable))
	} else {
		for off := int64(0); off < src.Length; off += sliceSize {
			queue = append(queue, &slice{off: off, n: min(sliceSize, src.Length-off)})
		}
	}
	total, completed := len(queue), 0
	maxAttempts := 2*len(usable) + 2
	inflight := map[uint64]*posted{}
	perRail := map[*rail]int{}
	lastDone := map[*rail]time.Time{}
	moved := map[*rail]int64{}
	ch := make(chan Completion, len(usable)*t.cfg.MaxInFlight+1)
	defer func() {
		ids := make([]uint64, 0, len(inflight))
		for id := range inflight {
			ids = append(ids, id)
		}
		t.unregister(ids...)
	}()
	var lastErr error
	reresolved := 0

	for completed < total {
		changed := t.changes()
		full := map[*rail]bool{}
		waiting := false // a rail is connecting: progress is possible later
		// Degraded rails (link telemetry) get no new slice while a healthy
		// rail can take it; when none can, they still carry the transfer.
		at := t.cfg.Clock.Now()
		skipDegraded := false
		for _, r := range usable {
			if !r.degraded(at) && r.takesSlices(at) {
				skipDegraded = true
				break
			}
		}
		for len(queue) > 0 {
			s := queue[0]
			var best *rail
			var bestQP QueuePair
			var bestScore float64
			for i, r := range usable {
				if full[r] || perRail[r] >= t.cfg.MaxInFlight || (skipDegraded && r.degraded(at)) {
					continue
				}
				qp, err := t.ready(r)
				if errors.Is(err, fabric.ErrClosed) {
					return fabric.Stats{}, err
				}
				if qp == nil {
					waiting = waiting || err == nil
					continue
				}
				score := float64(perRail[r]+1) / r.rate()
				if total == 1 {
					score = float64(i + 1) // one slice: the nearest rail that works
				}
				if r == s.avoid {
					score *= 1e6 // only when no other rail can take it
				}
				if best == nil || score < bestScore {
					best, bestQP, bestScore = r, qp, score
				}
			}
			if best == nil {
				break
			}
			key := sess.keys[best.remote.NIC]
			m, err := register(best.local)
			if err != nil {
				return fabric.Stats{}, err
			}
			id, ok := t.register(ch)
			if !ok {
				return fabric.Stats{}, fabric.ErrClosed
			}
			wr := WorkRequest{ID: id, LKey: m.LKey(), LocalAddr: m.Addr() + uint64(s.off), Length: uint32(s.n),
				RKey: key.RKey, RemoteAddr: key.Addr + uint64(s.off)}
			switch {
			case len(s.segs) == 1:
				wr.LocalAddr = m.Addr() + uint64(s.segs[0].Off)
			case len(s.segs) > 1:
				wr.SGL = make([]Segment, len(s.segs))
				for i, g := range s.segs {
					wr.SGL[i] = Segment{LKey: m.LKey(), Addr: m.Addr() + uint64(g.Off), Length: uint32(g.Len)}
				}
			}
			if push {
				err = bestQP.PostWrite(wr)
			} else {
				err = bestQP.PostRead(wr)
			}
			if err != nil {
				t.unregister(id)
				if errors.Is(err, ErrQueueFull) {
					full[best] = true
				} else {
					t.railFailed(best, bestQP, err)
				}
				continue
			}
			queue = queue[1:]
			inflight[id] = &posted{s: s, r: best, qp: bestQP, gen: sess.gen, at: time.Now()}
			perRail[best]++
		}
		if len(inflight) == 0 && len(queue) > 0 && !waiting && len(full) == 0 {
			return fabric.Stats{}, fmt.Errorf("%w: every rail to %s is paused or broken (last error: %v)",
				fabric.ErrPeerClosed, src.Peer, lastErr)
		}
		// Rails whose shared queue pair is full (other transfers' requests)
		// free up without any event this loop sees: look again shortly.
		var retry <-chan time.Time
		if len(full) > 0 && len(inflight) == 0 {
			retry = time.After(2 * time.Millisecond)
		}
		var wc Completion
		select {
		case wc = <-ch:
		case <-changed:
			continue
		case <-retry:
			continue
		case <-t.base.Done():
			return fabric.Stats{}, fabric.ErrClosed
		case <-ctx.Done():
			return fabric.Stats{}, ctx.Err()
		}
		p := inflight[wc.ID]
		if p == nil {
			continue
		}
		delete(inflight, wc.ID)
		perRail[p.r]--
		now := time.Now()
		switch wc.Status {
		case StatusSuccess:
			completed++
			moved[p.r] += p.s.n
			// Service time: since the later of its posting and the rail's
			// previous completion, as slices queue behind each other.
			began := p.at
			if lastDone[p.r].After(began) {
				began = lastDone[p.r]
			}
			service := now.Sub(began)
			lastDone[p.r] = now
			p.r.succeeded(int(p.s.n), service)
			if m := t.cfg.Metrics; m != nil {
				m.RailBytes.WithLabelValues(p.r.label).Add(float64(p.s.n))
				m.Slices.WithLabelValues(p.r.label, "ok").Inc()
			}
			continue
		case StatusRemoteAccess:
			if p.gen < sess.gen {
				queue = append(queue, p.s) // keys of a registration already replaced
				continue
			}
			if sess.qp.Err() == nil {
				return fabric.Stats{}, fmt.Errorf("%w: the owner revoked the registration (remote access error on rail %s)",
					fabric.ErrObjectFreed, p.r.label)
			}
			// The queue pair the registration was tied to broke, so the
			// owner released it: register again and carry on.
			if reresolved++; reresolved > maxReresolve {
				return fabric.Stats{}, fmt.Errorf("%w: lost the owner's registration %d times", fabric.ErrPeerClosed, reresolved)
			}
			ns, err := t.resolve(ctx, usable, src, push)
			if err != nil {
				return fabric.Stats{}, err
			}
			// Released on the owner's side with the queue pair; the new
			// one takes its place, for the caller's done too.
			ns.gen = sess.gen + 1
			*sess = *ns
			queue = append(queue, p.s)
			continue
		case StatusLocalProtection:
			return fabric.Stats{}, fmt.Errorf("rdma: local protection error on rail %s: %v", p.r.label, wc.Err)
		}
		// The rail failed (broken, stalled, corrupt): move the slice.
		lastErr = wc.Err
		if m := t.cfg.Metrics; m != nil {
			m.Slices.WithLabelValues(p.r.label, "error").Inc()
			m.SliceRetry.Inc()
		}
		t.railFailed(p.r, p.qp, fmt.Errorf("%v: %w", wc.Status, wc.Err))
		if p.s.attempts++; p.s.attempts >= maxAttempts {
			return fabric.Stats{}, ioError(fmt.Errorf("slice at %d failed %d times: %w", p.s.off, p.s.attempts, wc.Err))
		}
		p.s.avoid = p.r
		queue = append(queue, p.s)
	}
	stats.Streams = len(moved)
	stats.Duration = time.Since(start)
	return stats, nil
}
