package tcp

import (
	"context"
	"fmt"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/tensor"
)

var _ fabric.GatherWriter = (*Transport)(nil)

// WriteRuns pushes the concatenation of runs of src into the sink dst
// names, at dst.Offset, straight from src: no packed copy of the runs is
// made; a block inside one run goes out from it, a block of several is
// gathered into a block of cache-resident scratch first (sendGathered
// says why).
// The wire format is Write's: the owner sees ordinary blocks, striped and
// compressed as Write's would be. One run is Write of that range (with the
// object's cached checksums when it starts the object).
func (t *Transport) WriteRuns(ctx context.Context, src tensor.Buffer, runs []fabric.Run, dst fabric.Remote) (fabric.Stats, error) {
	if err := fabric.CheckRuns(runs, src.Len(), dst.Length); err != nil {
		return fabric.Stats{}, err
	}
	if tensor.IsDevice(src) {
		return fabric.Stats{}, fmt.Errorf("%w: tcp sends runs of host memory only (the planner packs device memory)", fabric.ErrBadRequest)
	}
	from, err := tensor.BytesOf(src)
	if err != nil {
		return fabric.Stats{}, err
	}
	if len(runs) == 1 {
		r := runs[0]
		var sums *tensor.ChunkSums
		if r.Off == 0 {
			sums = tensor.SumsOf(src)
		}
		return t.runWith(ctx, opWrite, dst, from[r.Off:r.Off+r.Len], nil, nil, sums)
	}
	return t.runWith(ctx, opWrite, dst, nil, &gather{src: from, runs: runs, n: dst.Length}, nil, nil)
}

// gather is the data of a gathered push: the runs of src, concatenated, n
// bytes in all.
type gather struct {
	src  []byte
	runs []fabric.Run
	n    int64
}

// slice is the gather of bytes [a, b) of g's concatenation (a stripe).
func (g *gather) slice(a, b int64) *gather {
	out := &gather{src: g.src, n: b - a}
	var at int64
	for _, r := range g.runs {
		lo, hi := max(a, at), min(b, at+r.Len)
		if lo < hi {
			out.runs = append(out.runs, fabric.Run{Off: r.Off + lo - at, Len: hi - lo})
		}
		at += r.Len
		if at >= b {
			break
		}
	}
	return out
}

// cursor walks a gather's bytes in order.
type cursor struct {
	g  *gather
	i  int   // the run it is in
	in int64 // bytes of that run already taken
}

// take appends the pieces of src that make the next n bytes to v.
func (c *cursor) take(v [][]byte, n int64) [][]byte {
	for n > 0 {
		r := c.g.runs[c.i]
		k := min(n, r.Len-c.in)
		at := r.Off + c.in
		v = append(v, c.g.src[at:at+k])
		c.in += k
		n -= k
		if c.in == r.Len {
			c.i, c.in = c.i+1, 0
		}
	}
	return v
}

// maxGatherVec bounds one writev's vector for a gathered push: blocks of
// many small runs go out fewer to a writev past it.
const maxGatherVec = 1024

// sendGathered is sendBlocks for a gathered push: the blocks are cut from
// g's concatenation as sendBlocks cuts data, so the owner sees the blocks
// sendBlocks would send of the packed bytes. A block inside one run goes
// out by writev straight from it, as sendBlocks sends. A block of several
// runs is copied into the link's block-sized scratch, which stays in cache,
// checksummed there in one pass and sent from there: measured against
// writev over its runs with the checksum streamed over them (XXH3's
// streaming form copies every run through its own 1 KiB buffer, and the
// kernel pays per iovec), it took 1.11-1.18x a plain push's time of the
// same bytes against 1.23-1.27x (BenchmarkWriteRuns, 4 KiB runs, load 6-7;
// docs/benchmarks.md "Resharding" has the quiet figures). What it spares
// is the pack's copy of the whole move through main memory, written once
// and read twice (checksum, socket). Sealed (unsummed) blocks need no
// checksum and go out by writev over their runs; a block to compress is
// copied whole for the encoder.
func (l *link) sendGathered(prefix []byte, g *gather, chunk int, compress bool, hint tcodec.Hint, corrupt, unsummed bool) (int64, error) {
	wire := int64(len(prefix))
	if g.n == 0 {
		if len(prefix) == 0 {
			return 0, nil
		}
		return wire, l.writev(append(l.vec[:0], prefix))
	}
	if compress && l.enc == nil {
		l.enc = tcodec.NewEncoder()
	}
	if compress && !l.sampleShrinksGathered(g, hint) {
		compress = false
		l.sampleSkips++
	}
	cur := cursor{g: g}
	for off := int64(0); off < g.n; {
		v := l.gvec[:0]
		if prefix != nil {
			v = append(v, prefix)
			prefix = nil
		}
		for i := 0; i < batch && off < g.n && len(v) < maxGatherVec; i++ {
			n := min(int64(chunk), g.n-off)
			off += n
			hi := len(v)
			v = append(v, nil) // the header, once known
			v = cur.take(v, n)
			pieces := v[hi+1:]
			// whole: the block went into the scratch (or the encoder), which
			// the next block reuses: it ends this writev.
			whole := false
			var h tcodec.Header
			switch {
			case compress:
				l.encoded++
				var payload []byte
				var err error
				if h, payload, err = l.enc.Encode(gatherInto(l.gatherBuf(int(n)), pieces), hint); err != nil {
					return wire, err
				}
				v, whole = append(v[:hi+1], payload), true
			case unsummed:
				h = tcodec.Header{Codec: tcodec.Raw, RawLen: int(n), EncLen: int(n)}
			case len(pieces) == 1:
				h = tcodec.RawHeader(pieces[0])
				l.sumStats.add(sumComputed)
			default:
				blk := gatherInto(l.gatherBuf(int(n)), pieces)
				h = tcodec.RawHeader(blk)
				l.sumStats.add(sumComputed)
				v, whole = append(v[:hi+1], blk), true
			}
			if corrupt {
				h.Sum ^= 1
				corrupt = false
			}
			h.Put(l.hdrs[i][:])
			v[hi] = l.hdrs[i][:]
			wire += int64(headerSize + h.EncLen)
			if whole {
				break
			}
		}
		l.gvec = v[:0]
		if err := l.writev(v); err != nil {
			return wire, err
		}
	}
	return wire, nil
}

// gatherInto copies pieces into dst, in order, and returns dst.
func gatherInto(dst []byte, pieces [][]byte) []byte {
	at := 0
	for _, p := range pieces {
		at += copy(dst[at:], p)
	}
	return dst
}

// gatherBuf is the link's scratch block of n bytes for gathered blocks
// that must be contiguous (of several runs, to compress, to sample).
func (l *link) gatherBuf(n int) []byte {
	if cap(l.gbuf) < n {
		l.gbuf = make([]byte, max(n, DefaultChunkSize))
	}
	return l.gbuf[:n]
}

// sampleShrinksGathered is sampleShrinks over a gather: the same slices of
// the concatenation, copied out first.
func (l *link) sampleShrinksGathered(g *gather, hint tcodec.Hint) bool {
	if g.n < sampleMin {
		return true
	}
	step := (g.n - sampleSize) / (sampleSlices - 1)
	for i := range int64(sampleSlices) {
		off := i * step
		off -= off % 8
		p := l.gatherBuf(sampleSize)
		c := cursor{g: g}
		c.skip(off)
		at := 0
		for _, q := range c.take(l.gvec[:0], sampleSize) {
			at += copy(p[at:], q)
		}
		h, _, err := l.enc.Encode(p, hint)
		if err == nil && h.EncLen > 0 && h.EncLen < h.RawLen {
			return true
		}
	}
	return false
}

// skip moves the cursor n bytes on.
func (c *cursor) skip(n int64) {
	for n > 0 {
		r := c.g.runs[c.i]
		k := min(n, r.Len-c.in)
		c.in += k
		n -= k
		if c.in == r.Len {
			c.i, c.in = c.i+1, 0
		}
	}
}
