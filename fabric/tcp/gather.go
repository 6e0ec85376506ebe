package tcp

import (
	"context"

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
	from, err := fabric.RunsSource(fabric.TCP, src, runs, dst)
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

// one returns the next n bytes and moves past them when they lie in one
// run of src.
func (c *cursor) one(n int64) ([]byte, bool) {
	r := c.g.runs[c.i]
	if r.Len-c.in < n {
		return nil, false
	}
	at := r.Off + c.in
	c.skip(n)
	return c.g.src[at : at+n], true
}

// copyOut fills dst with the next len(dst) bytes and returns it.
func (c *cursor) copyOut(dst []byte) []byte {
	for at := 0; at < len(dst); {
		r := c.g.runs[c.i]
		k := copy(dst[at:], c.g.src[r.Off+c.in:r.Off+r.Len])
		at += k
		c.skip(int64(k))
	}
	return dst
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
// and read twice (checksum, socket). The scratch holds a writev's batch
// of blocks (1 MiB at the default chunk): one block a writev made the
// syscalls cost more than the copies saved.
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
		v := l.vec[:0]
		if prefix != nil {
			v = append(v, prefix)
			prefix = nil
		}
		for i := 0; i < batch && off < g.n; i++ {
			n := min(int64(chunk), g.n-off)
			off += n
			p, inRun := cur.one(n)
			if !inRun {
				p = cur.copyOut(l.gatherBlock(i, int(n), chunk))
			}
			var h tcodec.Header
			switch {
			case compress:
				l.encoded++
				var err error
				if h, p, err = l.enc.Encode(p, hint); err != nil {
					return wire, err
				}
			case unsummed:
				h = tcodec.Header{Codec: tcodec.Raw, RawLen: int(n), EncLen: int(n)}
			default:
				h = tcodec.RawHeader(p)
				l.sumStats.add(sumComputed)
			}
			if corrupt {
				h.Sum ^= 1
				corrupt = false
			}
			h.Put(l.hdrs[i][:])
			v = append(v, l.hdrs[i][:], p)
			wire += int64(headerSize + len(p))
			if compress {
				break // the payload lives in the encoder until the next block
			}
		}
		if err := l.writev(v); err != nil {
			return wire, err
		}
	}
	return wire, nil
}

// gatherBlock is block i of the link's scratch for a writev's batch of
// gathered blocks, n bytes of it.
func (l *link) gatherBlock(i, n, chunk int) []byte {
	if len(l.gscratch) < batch*chunk {
		l.gscratch = make([]byte, batch*chunk)
	}
	return l.gscratch[i*chunk : i*chunk+n]
}

// gatherBuf is the link's scratch block of n bytes for sampling a gathered
// push's bytes.
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
		c := cursor{g: g}
		c.skip(off)
		h, _, err := l.enc.Encode(c.copyOut(l.gatherBuf(sampleSize)), hint)
		if err == nil && h.EncLen > 0 && h.EncLen < h.RawLen {
			return true
		}
	}
	return false
}
