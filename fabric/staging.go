package fabric

import (
	"context"
	"fmt"
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
	if n <= 0 {
		return fetch(ctx, 0, nil) // still asks the owner: the claim is checked
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
	// copied[h] is the device copy out of half h, under way.
	var copied [2]tensor.Pending
	wait := func(h int) error {
		if copied[h] == nil {
			return nil
		}
		err := copied[h].Wait(ctx)
		copied[h] = nil
		return err
	}
	var first error
	for i, off := 0, int64(0); off < n && first == nil; i, off = i+1, off+seg {
		h := i % int(halves)
		if err := wait(h); err != nil {
			first = err
			break
		}
		k := min(seg, n-off)
		at := int64(h) * seg
		if err := fetch(ctx, off, buf[at:at+k]); err != nil {
			first = err
			break
		}
		// One copy in flight at a time (tensor.AsyncCopier's rule): the
		// previous one had this fetch's time to finish.
		if err := wait(1 - h); err != nil {
			first = err
			break
		}
		// An async copy on the device's stream where it has one.
		copied[h] = tensor.StartCopy(ctx, dst, off, stage, at, k)
	}
	for h := range copied {
		if err := wait(h); err != nil && first == nil {
			first = fmt.Errorf("copy staged bytes into %v: %w", dst.Device(), err)
		}
	}
	return first
}

// ReadStaged is StagedRead for a whole Read: read(ctx, r, p) moves the
// source's range r (a segment of src) into the host bytes p, and the
// segments' stats add up into the returned one, named transport.
func ReadStaged(ctx context.Context, transport string, src Remote, dst tensor.Buffer, read func(ctx context.Context, r Remote, p []byte) (Stats, error)) (Stats, error) {
	start := time.Now()
	total := Stats{Transport: transport}
	err := StagedRead(ctx, dst, src.Length, func(ctx context.Context, off int64, p []byte) error {
		r := src
		r.Offset, r.Length = src.Offset+off, int64(len(p))
		st, err := read(ctx, r, p)
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
