package shm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/tensor"
)

// Batches (fabric.BatchReader). Read pays one grant round trip per object,
// each carrying its own descriptor. ReadBatch asks one owner for up to
// maxBatch objects in one request (a frame, batchwire.go), gets every
// grant in one reply and the descriptors in as few messages as the kernel
// allows, copies the objects (large ones on several cores, as Read does),
// and ends the frame with one done. Nothing of the security model changes:
// every item is a read-only grant of its own object (or a place in a slab
// this connection holds), checked against the claim's range by the owner
// and against the grant by us, re-validated every time, its mapping
// cached as Read caches it; an item the owner refuses fails alone.
//
// WriteBatch (fabric.BatchWriter) is the same exchange in the push
// direction (opBatchPush): one request per owner listing up to maxBatch
// sinks, one reply granting each sink's own pages writable (exactly what
// a single push grant reaches), a copy of each source into its sink, one
// done. A closed, unknown, forged or busy sink (fabric.ErrSinkBusy) fails
// its item alone.

var (
	_ fabric.BatchReader = (*Transport)(nil)
	_ fabric.BatchWriter = (*Transport)(nil)
)

const (
	// batchFrameBytes bounds the bytes one frame pins and copies, so
	// a large batch moves as several frames, batchConns of them at once
	// per owner: one is granted while another copies. The copies of one
	// owner's frames take turns (ownerJobs.copying): a large one runs on
	// every core already.
	batchFrameBytes = 256 << 20
	batchConns      = 2
)

// ErrDescriptorLimit is the failure of a batch whose descriptors this
// process could not take: its descriptor table is full (RLIMIT_NOFILE).
// Nothing is leaked (the kernel drops what it could not install, and the
// connection, which the owner pins the batch's objects for, is closed);
// the planner reads the items again one by one, one descriptor at a time.
var ErrDescriptorLimit = fmt.Errorf("shm: this process's descriptor table is full (RLIMIT_NOFILE): the owner's grants could not be received: %w", unix.EMFILE)

// batchOOB is room for one packet's descriptors (at most SCM_MAX_FD).
var batchOOB = unix.CmsgSpace(maxFDsPerPacket * 4)

// ReadBatch pulls srcs[i] into dsts[i] for every i; see fabric.BatchReader.
func (t *Transport) ReadBatch(ctx context.Context, srcs []fabric.Remote, dsts []tensor.Buffer) ([]fabric.Stats, []error) {
	if errs := fabric.CheckBatch(srcs, dsts); errs != nil {
		return make([]fabric.Stats, len(srcs)), errs
	}
	return t.batch(ctx, false, srcs, dsts)
}

// WriteBatch pushes srcs[i] into the sink dsts[i] names for every i; see
// fabric.BatchWriter.
func (t *Transport) WriteBatch(ctx context.Context, srcs []tensor.Buffer, dsts []fabric.Remote) ([]fabric.Stats, []error) {
	if errs := fabric.CheckWriteBatch(srcs, dsts); errs != nil {
		return make([]fabric.Stats, len(dsts)), errs
	}
	return t.batch(ctx, true, dsts, srcs)
}

// batch moves the items of a read (push false) or push batch: rems[i] is
// item i's remote object or sink, bufs[i] its local buffer.
func (t *Transport) batch(ctx context.Context, push bool, rems []fabric.Remote, bufs []tensor.Buffer) ([]fabric.Stats, []error) {
	sts, errs := make([]fabric.Stats, len(rems)), make([]error, len(rems))
	if t.closed.Load() {
		for i := range errs {
			errs[i] = fabric.ErrClosed
		}
		return sts, errs
	}
	t.c.runBatch(ctx, t.name, push, rems, bufs, sts, errs)
	return sts, errs
}

// BatchStats counts the client's batch frames (ReadBatch and WriteBatch).
type BatchStats struct {
	Frames      int64 // batch requests answered (one round trip each)
	Items       int64 // items those frames granted or refused
	Descriptors int64 // descriptors received with them
	Packets     int64 // packets those descriptors came in (SCM_MAX_FD each)
	OneByOne    int64 // items read or pushed one by one because the owner refused batches
}

// batchCounters are BatchStats, updated as frames end.
type batchCounters struct {
	frames, items, fds, packets, oneByOne atomic.Int64
}

// BatchStats reports the batch frames this client ran.
func (c *Client) BatchStats() BatchStats {
	b := &c.batch
	return BatchStats{Frames: b.frames.Load(), Items: b.items.Load(), Descriptors: b.fds.Load(), Packets: b.packets.Load(), OneByOne: b.oneByOne.Load()}
}

// batchJob is one item of a batch: the owner's side and ours.
type batchJob struct {
	i   int           // its index in the caller's slices
	src fabric.Remote // the owner's object (read) or sink (push)
	buf tensor.Buffer // the caller's destination (read) or source (push)
	p   []byte        // host-visible buf, or nil
	dev tensor.Buffer // device buf when p is nil
}

// ownerJobs are the items of one owner.
type ownerJobs struct {
	want        peer.ID
	owner, addr string
	push        bool // the items are pushes into the owner's sinks
	jobs        []batchJob
	copying     chan struct{} // held by the frame whose item is copying
}

// runBatch moves every item: srcs[i] (the owner's side) into bufs[i] for
// a read, bufs[i] into srcs[i] for a push.
func (c *Client) runBatch(ctx context.Context, name string, push bool, srcs []fabric.Remote, dsts []tensor.Buffer, sts []fabric.Stats, errs []error) {
	groups := map[string]*ownerJobs{}
	var order []*ownerJobs
	// Decoding a peer ID and naming its owner cost more than granting a
	// small object: once per owner.
	type target struct {
		want peer.ID
		addr string
		err  error
	}
	targets := map[[2]string]target{}
	for i, src := range srcs {
		tk := [2]string{src.Peer, addrOf(name, src)}
		tg, ok := targets[tk]
		if !ok {
			tg.want, tg.addr, tg.err = c.target(name, fabric.Remote{Peer: src.Peer, Addrs: src.Addrs})
			targets[tk] = tg
		}
		want, addr, err := tg.want, tg.addr, tg.err
		if err == nil && (src.Offset < 0 || src.Length < 0) {
			err = fmt.Errorf("%w: range [%d,+%d)", fabric.ErrBadRequest, src.Offset, src.Length)
		}
		var p []byte
		var dev tensor.Buffer
		switch {
		case err != nil:
		case len(src.Claim.Token) > maxToken:
			err = fmt.Errorf("%w: claim token of %d bytes", fabric.ErrBadRequest, len(src.Claim.Token))
		case dsts[i].Len() < src.Length && push:
			err = fmt.Errorf("%w: source holds %d of the %d bytes to push", tensor.ErrTooSmall, dsts[i].Len(), src.Length)
		case dsts[i].Len() < src.Length:
			err = fmt.Errorf("%w: destination holds %d of %d bytes", tensor.ErrTooSmall, dsts[i].Len(), src.Length)
		default:
			p, dev, err = hostOrDevice(dsts[i], src.Length)
		}
		if err != nil {
			errs[i] = err
			continue
		}
		g := groups[tk[0]+"@"+addr]
		if g == nil {
			g = &ownerJobs{want: want, owner: ownerKey(want, addr), addr: addr, push: push, copying: make(chan struct{}, 1)}
			groups[tk[0]+"@"+addr] = g
			order = append(order, g)
		}
		g.jobs = append(g.jobs, batchJob{i: i, src: src, buf: dsts[i], p: p, dev: dev})
	}
	var wg sync.WaitGroup
	for _, g := range order {
		sem := make(chan struct{}, batchConns)
		for _, frame := range frames(g.jobs) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					for _, j := range frame {
						errs[j.i] = ctx.Err()
					}
					return
				}
				defer func() { <-sem }()
				c.runFrame(ctx, name, g, frame, len(g.jobs), sts, errs)
			}()
		}
	}
	wg.Wait()
}

// frames cuts one owner's items into frames of at most maxBatch items and
// batchFrameBytes bytes (a larger item goes alone).
func frames(jobs []batchJob) [][]batchJob {
	var out [][]batchJob
	start, bytes := 0, int64(0)
	for k, j := range jobs {
		if k > start && (k-start == maxBatch || bytes+j.src.Length > batchFrameBytes) {
			out = append(out, jobs[start:k])
			start, bytes = k, 0
		}
		bytes += j.src.Length
	}
	if start < len(jobs) {
		out = append(out, jobs[start:])
	}
	return out
}

// errBatchRefused marks an owner's refusal of a whole batch.
var errBatchRefused = errors.New("shm: owner refused the batch")

// runFrame moves one frame of g's items and fills in their results;
// coalesced is how many items of g the batch moves together.
func (c *Client) runFrame(ctx context.Context, name string, g *ownerJobs, jobs []batchJob, coalesced int, sts []fabric.Stats, errs []error) {
	start := time.Now()
	res := make([]error, len(jobs))
	done := make([]time.Duration, len(jobs))
	copied := make([]bool, len(jobs))
	err := ctx.Err()
	if err == nil {
		err = c.withConn(ctx, g.want, g.owner, g.addr, func(pc *pconn) error {
			clear(res)
			return c.frameOn(ctx, pc, g, jobs, res, copied, done, start)
		})
	}
	if errors.Is(err, errBatchRefused) && errors.Is(err, fabric.ErrBadRequest) {
		// An owner without batches (wire version 4, or of reads only):
		// one by one.
		c.cfg.Logger.Info("shm owner refused a batch (an older owner?); moving its items one by one", "owner", g.owner, "items", len(jobs), "push", g.push, "err", err)
		c.batch.oneByOne.Add(int64(len(jobs)))
		for _, j := range jobs {
			if err := ctx.Err(); err != nil {
				errs[j.i] = err
				continue
			}
			if g.push {
				sts[j.i], errs[j.i] = c.write(ctx, name, j.buf, j.src, nil)
			} else {
				sts[j.i], errs[j.i] = c.read(ctx, name, j.src, j.buf)
			}
		}
		return
	}
	for k, j := range jobs {
		switch {
		case res[k] != nil:
			errs[j.i] = res[k]
		case err != nil:
			// Not confirmed (or never granted): the copy must not be used.
			errs[j.i] = err
		default:
			sts[j.i] = fabric.Stats{Transport: name, Bytes: j.src.Length, Duration: done[k], Streams: 1, ViewCopy: copied[k] && !g.push, Coalesced: coalesced}
		}
	}
}

// frameOn runs one frame's exchange on pc: one request, one reply (and
// descriptor packets), a copy per granted item, one done. res gets each
// item's own failure; the error returned fails every item res leaves nil.
func (c *Client) frameOn(ctx context.Context, pc *pconn, g *ownerJobs, jobs []batchJob, res []error, copied []bool, done []time.Duration, start time.Time) error {
	owner := g.owner
	keys := make([]cacheKey, len(jobs))
	helds := make([]*mapping, len(jobs))
	reqs := make([]request, len(jobs))
	for k, j := range jobs {
		keys[k] = cacheKey{owner: owner, object: j.src.Claim.Object, incarnation: j.src.Claim.Incarnation, push: g.push}
		reqs[k] = request{op: opRead, claim: j.src.Claim, offset: j.src.Offset, length: j.src.Length}
		if g.push {
			reqs[k].op = opPush
		}
		if helds[k] = c.cache.acquire(keys[k]); helds[k] != nil {
			reqs[k].have = helds[k].id
		}
	}
	items, fds, err := c.exchangeBatch(pc, reqs)
	if err != nil {
		for _, m := range helds {
			if m != nil {
				c.cache.release(m)
			}
		}
		return err
	}
	next := 0
	for k, it := range items {
		var mine []int
		if it.code == peerauth.StatusOK && it.g.flags&flagFD != 0 {
			mine = fds[next : next+1]
			next++
		}
		if err := it.err(); err != nil {
			if helds[k] != nil {
				c.cache.release(helds[k])
			}
			c.refused(keys[k], err)
			res[k] = err
			continue
		}
		copied[k] = it.g.flags&flagCopy != 0
		if err := ctx.Err(); err != nil && it.g.flags&flagSlab == 0 {
			// A slab's descriptor is adopted whatever happens (useGrant):
			// the owner will not send it again on this connection.
			closeAll(mine)
			if helds[k] != nil {
				c.cache.release(helds[k])
			}
			res[k] = err
			continue
		}
		j := jobs[k]
		g.copying <- struct{}{} // no wait on ctx: a copy checks it between chunks
		res[k] = c.useGrant(ctx, pc, keys[k], it.g, mine, helds[k], j.src, j.p, nil, j.dev)
		<-g.copying
		done[k] = time.Since(start)
	}
	return c.confirm(pc)
}

// exchangeBatch sends a frame's request and reads the owner's reply and
// every descriptor it announced, in item order.
func (c *Client) exchangeBatch(pc *pconn, reqs []request) ([]batchItem, []int, error) {
	pc.c.SetDeadline(time.Now().Add(c.cfg.StallTimeout))
	pc.out = appendBatch(pc.out[:0], reqs)
	if err := sendPacket(pc.c, pc.out, -1); err != nil {
		return nil, nil, staleOr(c.ioError(err))
	}
	if pc.bbuf == nil {
		pc.bbuf, pc.boob = make([]byte, maxBatchReply), make([]byte, batchOOB)
	}
	p, fds, err := recvPacket(pc.c, pc.bbuf, pc.boob)
	if err != nil {
		return nil, nil, staleOr(c.ioError(err))
	}
	items, n, err := parseBatchReply(p, len(reqs))
	if err != nil {
		closeAll(fds)
		if _, ok := errors.AsType[*peerauth.RemoteError](err); ok {
			return nil, nil, fmt.Errorf("%w: %w", errBatchRefused, err)
		}
		return nil, nil, err
	}
	if len(fds) != min(n, maxFDsPerPacket) {
		closeAll(fds)
		return nil, nil, fmt.Errorf("%w: batch reply announced %d descriptors and carried %d", fabric.ErrCorrupt, n, len(fds))
	}
	c.batch.frames.Add(1)
	c.batch.items.Add(int64(len(items)))
	c.batch.fds.Add(int64(n))
	c.batch.packets.Add(1)
	for len(fds) < n {
		c.batch.packets.Add(1)
		p, more, err := recvPacket(pc.c, pc.bbuf, pc.boob)
		fds = append(fds, more...)
		if err != nil {
			closeAll(fds)
			return nil, nil, c.ioError(err)
		}
		if want, err := parseFDs(p); err != nil || want != len(more) || len(fds) > n {
			closeAll(fds)
			return nil, nil, fmt.Errorf("%w: descriptor packet of %d descriptors (%v), %d of %d received", fabric.ErrCorrupt, len(more), err, len(fds), n)
		}
	}
	return items, fds, nil
}
