package fabric

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/tensor"
)

// StageSegment is the unit StagedRead moves: large enough that the extra
// request per segment is noise, small enough that two fit in pinned memory
// comfortably.
const StageSegment = 32 << 20

// StagedRead fills the first n bytes of dst, device memory the CPU cannot
// address, through host staging for a transport that needs host bytes
// (tcp, rdma): fetch(ctx, off, p) must fill p with bytes [off, off+len(p))
// of the source. Transfers longer than one StageSegment alternate between
// two staging halves, so the device copies segment i in while segment
// i+1 crosses the wire. It returns once every byte is in dst, or the
// first error (after the device copies it started have ended).
func StagedRead(ctx context.Context, dst tensor.Buffer, n int64, fetch func(ctx context.Context, off int64, p []byte) error) error {
	return StagedReadProgress(ctx, dst, n, func(ctx context.Context, off int64, p []byte, _ Received) error {
		return fetch(ctx, off, p)
	})
}

// Received tells StagedReadProgress that bytes [start, start+n) of the
// segment being fetched are in place (received and verified) before the
// fetch returns. A transport that moves a segment in several ranges at
// once (stripes) calls it for each, with the range's start and how much of
// it has arrived so far, from any goroutine; a range that starts again
// (a retried stripe) reports smaller n, which is ignored.
type Received func(start, n int64)

// copyPiece is the least that StagedReadProgress copies into the device
// before a segment's fetch returns: each copy costs a queued DMA and an
// event, small against this much wire time.
const copyPiece = 4 << 20

// StagedReadProgress is StagedRead for a transport that reports the bytes
// of a segment as they arrive (Received): they are copied into the device
// a piece at a time while the rest of the segment crosses the wire, so
// only the last piece's copy is not overlapped. One copy is in flight at
// a time (tensor.AsyncCopier's rule).
func StagedReadProgress(ctx context.Context, dst tensor.Buffer, n int64, fetch func(ctx context.Context, off int64, p []byte, received Received) error) error {
	if n <= 0 {
		return fetch(ctx, 0, nil, func(int64, int64) {}) // still asks the owner: the claim is checked
	}
	seg := min(n, StageSegment)
	halves := int64(1)
	if n > seg {
		halves = 2
	}
	stage, err := tensor.StageFor(ctx, dst, max(seg*halves, 1))
	if err != nil {
		return err
	}
	defer stage.Release()
	buf, err := tensor.BytesOf(stage)
	if err != nil {
		return err
	}
	c := &stagedCopies{ctx: ctx, dst: dst, stage: stage}
	var first error
	for i, off := 0, int64(0); off < n && first == nil; i, off = i+1, off+seg {
		k := min(seg, n-off)
		at := int64(i%int(halves)) * seg
		// Half h's bytes from two segments ago are in the device: every
		// copy waits for the one before, and segment i-1's copies began
		// after segment i-2's last.
		c.begin(off, at)
		if err := fetch(ctx, off, buf[at:at+k], c.received); err != nil {
			first = err
			break
		}
		if err := c.end(k); err != nil {
			first = err
		}
	}
	if err := c.wait(); err != nil && first == nil {
		first = err
	}
	return first
}

// stagedCopies copies a segment's bytes from staging into the device as
// they arrive (received) and the rest once fetched (end), one copy in
// flight across segments.
type stagedCopies struct {
	ctx        context.Context
	dst, stage tensor.Buffer

	mu      sync.Mutex
	off, at int64           // the segment's offset in dst and in the staging
	copied  map[int64]int64 // range start -> bytes of it copied (or being copied)
	pending tensor.Pending
	err     error // the first failed copy
}

func (c *stagedCopies) begin(off, at int64) {
	c.mu.Lock()
	c.off, c.at, c.copied = off, at, map[int64]int64{}
	c.mu.Unlock()
}

// start copies segment bytes [from, to) after the copy before it ended.
// Called with mu held.
func (c *stagedCopies) start(from, to int64) {
	if c.err != nil {
		return
	}
	if c.err = c.waitLocked(); c.err != nil {
		return
	}
	c.pending = tensor.StartCopy(c.ctx, c.dst, c.off+from, c.stage, c.at+from, to-from)
}

func (c *stagedCopies) waitLocked() error {
	if c.pending == nil {
		return nil
	}
	err := c.pending.Wait(c.ctx)
	c.pending = nil
	if err != nil {
		return fmt.Errorf("copy staged bytes into %v: %w", c.dst.Device(), err)
	}
	return nil
}

func (c *stagedCopies) wait() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.waitLocked(); err != nil && c.err == nil {
		c.err = err
	}
	return c.err
}

func (c *stagedCopies) received(start, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	done := c.copied[start]
	if n-done < copyPiece {
		return
	}
	c.copied[start] = n
	c.start(start+done, start+n)
}

// end copies what the segment's k bytes still need once fetched: the gaps
// between the ranges copied as they arrived.
func (c *stagedCopies) end(k int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	starts := make([]int64, 0, len(c.copied))
	for s := range c.copied {
		starts = append(starts, s)
	}
	slices.Sort(starts)
	pos := int64(0)
	for _, s := range starts {
		if s > pos {
			c.start(pos, min(s, k))
		}
		pos = max(pos, min(s+c.copied[s], k))
	}
	if pos < k {
		c.start(pos, k)
	}
	return c.err
}

// ReadStaged is StagedRead for a whole Read: read(ctx, r, p) moves the
// source's range r (a segment of src) into the host bytes p, and the
// segments' stats add up into the returned one, named transport.
func ReadStaged(ctx context.Context, transport string, src Remote, dst tensor.Buffer, read func(ctx context.Context, r Remote, p []byte) (Stats, error)) (Stats, error) {
	return ReadStagedProgress(ctx, transport, src, dst, func(ctx context.Context, r Remote, p []byte, _ func(off int64, n int)) (Stats, error) {
		return read(ctx, r, p)
	})
}

// ReadStagedProgress is ReadStaged for a transport that reports bytes as
// they arrive: received(off, n) says that n bytes from offset off of the
// source (the object's coordinates, as Remote.Offset) are in place in p.
func ReadStagedProgress(ctx context.Context, transport string, src Remote, dst tensor.Buffer, read func(ctx context.Context, r Remote, p []byte, received func(off int64, n int)) (Stats, error)) (Stats, error) {
	start := time.Now()
	total := Stats{Transport: transport}
	err := StagedReadProgress(ctx, dst, src.Length, func(ctx context.Context, off int64, p []byte, received Received) error {
		r := src
		r.Offset, r.Length = src.Offset+off, int64(len(p))
		st, err := read(ctx, r, p, func(at int64, n int) { received(at-r.Offset, int64(n)) })
		total.Transport = st.Transport
		total.Bytes += st.Bytes
		total.Streams = max(total.Streams, st.Streams)
		return err
	})
	if err != nil {
		return Stats{}, err
	}
	total.Duration = time.Since(start)
	return total, nil
}

// WriteStaged pushes the first n bytes of src, device memory the CPU
// cannot address, through host staging for a transport that needs host
// bytes (tcp, rdma): write(ctx, off, p) must push p as bytes [off,
// off+len(p)) of the destination (a push of that range, as a stripe of a
// striped push is). Transfers longer than one StageSegment alternate
// between two staging halves, so the device copies segment i+1 out (an
// async copy where the device has one, one in flight) while segment i is
// pushed. The device copies count in the returned duration.
func WriteStaged(ctx context.Context, transport string, src tensor.Buffer, n int64, write func(ctx context.Context, off int64, p []byte) (Stats, error)) (Stats, error) {
	seg := max(min(n, StageSegment), 0)
	halves := int64(1)
	if n > seg {
		halves = 2
	}
	stage, err := tensor.StageFor(ctx, src, max(seg*halves, 1))
	if err != nil {
		return Stats{}, err
	}
	defer stage.Release()
	buf, err := tensor.BytesOf(stage)
	if err != nil {
		return Stats{}, err
	}
	start := time.Now()
	copyOut := func(i int64) tensor.Pending {
		off, at := i*seg, (i%halves)*seg
		return tensor.StartCopy(ctx, stage, at, src, off, min(seg, n-off))
	}
	staged := func(err error, off int64) error {
		if err == nil {
			return nil
		}
		return fmt.Errorf("%s: stage bytes %d.. of %v: %w", transport, off, src.Device(), err)
	}
	total := Stats{Transport: transport}
	if n <= 0 {
		st, err := write(ctx, 0, nil)
		st.Duration = time.Since(start)
		return st, err
	}
	if err := staged(copyOut(0).Wait(ctx), 0); err != nil {
		return Stats{}, err
	}
	for i, off := int64(0), int64(0); off < n; i, off = i+1, off+seg {
		var next tensor.Pending
		if off+seg < n {
			next = copyOut(i + 1)
		}
		at, k := (i%halves)*seg, min(seg, n-off)
		st, err := write(ctx, off, buf[at:at+k])
		if next != nil {
			// Always wait: the device may be writing the other half.
			if cerr := staged(next.Wait(ctx), off+seg); err == nil {
				err = cerr
			}
		}
		if st.Transport != "" {
			total.Transport = st.Transport
		}
		total.Bytes += st.Bytes
		total.Streams = max(total.Streams, st.Streams)
		if err != nil {
			return Stats{}, err
		}
	}
	total.Duration = time.Since(start)
	return total, nil
}
