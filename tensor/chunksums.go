package tensor

import (
	"sync/atomic"

	"github.com/zeebo/xxh3"
)

// SumChunk is the grid of ChunkSums: the XXH3-64 of every SumChunk bytes
// of a sealed object, from the first byte of its published view. It is the
// tcp transport's default block (fabric/tcp.DefaultChunkSize, which a test
// there holds equal), so an owner serving a read on that grid finds each
// block's checksum here instead of reading the object's memory for it.
const SumChunk = 256 << 10

// ChunkSums caches the XXH3-64 checksum of each SumChunk-byte block of a
// byte range that no longer changes (a sealed object): computed once, by
// whoever touches the bytes first (the copy that made the object, with
// Copy; or the first sender, with Set), and read by every later sender.
// Offsets are in the buffer the range lives in: block k covers
// [base+k*SumChunk, min(base+(k+1)*SumChunk, end)). It is safe for
// concurrent use; a block set twice gets the same sum, as the bytes do not
// change.
type ChunkSums struct {
	base, end int64
	sums      []atomic.Uint64
	known     []atomic.Bool
}

// NewChunkSums returns an empty cache for the bytes [base, end) of a buffer.
func NewChunkSums(base, end int64) *ChunkSums {
	n := (max(end-base, 0) + SumChunk - 1) / SumChunk
	return &ChunkSums{base: base, end: end, sums: make([]atomic.Uint64, n), known: make([]atomic.Bool, n)}
}

// block is the index of the block that is exactly [off, off+n), if there is one.
func (c *ChunkSums) block(off int64, n int) (int64, bool) {
	if c == nil || off < c.base || (off-c.base)%SumChunk != 0 {
		return 0, false
	}
	k := (off - c.base) / SumChunk
	if k >= int64(len(c.sums)) || int64(n) != min(SumChunk, c.end-off) {
		return 0, false
	}
	return k, true
}

// Shifted is the same cache, its blocks seen at offsets moved by by: a
// window into the buffer that starts at byte w sees them Shifted(-w). Nil
// for a nil cache.
func (c *ChunkSums) Shifted(by int64) *ChunkSums {
	if c == nil {
		return nil
	}
	return &ChunkSums{base: c.base + by, end: c.end + by, sums: c.sums, known: c.known}
}

// Span is the byte range the cache covers, [base, end).
func (c *ChunkSums) Span() (base, end int64) { return c.base, c.end }

// Get returns the checksum of the bytes [off, off+n) if they are one block
// of the grid and its checksum is known.
func (c *ChunkSums) Get(off int64, n int) (uint64, bool) {
	k, ok := c.block(off, n)
	if !ok || !c.known[k].Load() {
		return 0, false
	}
	return c.sums[k].Load(), true
}

// Set records the checksum of the bytes [off, off+n) when they are one
// block of the grid, and reports whether they were; any other range is
// ignored.
func (c *ChunkSums) Set(off int64, n int, sum uint64) bool {
	k, ok := c.block(off, n)
	if ok {
		c.sums[k].Store(sum)
		c.known[k].Store(true) // after the sum: a Get that sees known sees it
	}
	return ok
}

// Known is how many blocks have their checksum, and how many there are.
func (c *ChunkSums) Known() (known, blocks int) {
	for i := range c.known {
		if c.known[i].Load() {
			known++
		}
	}
	return known, len(c.known)
}

// Fill computes every block's checksum from p, the bytes [base, end).
func (c *ChunkSums) Fill(p []byte) {
	for off := 0; off < len(p); off += SumChunk {
		b := p[off:min(off+SumChunk, len(p))]
		c.Set(c.base+int64(off), len(b), Sum(b))
	}
}

// Copy copies src into dst, the bytes [base, end) (len(src) of them), and
// computes each block's checksum right after its copy, from dst while it is
// still in cache: the one pass over the bytes that a copy makes anyway
// also yields the checksums that a sender would otherwise read the memory
// again for.
func (c *ChunkSums) Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	for off := 0; off < n; {
		end := min(off+SumChunk, n)
		copy(dst[off:end], src[off:end])
		c.Set(c.base+int64(off), end-off, Sum(dst[off:end]))
		off = end
	}
	return n
}

// Sum is the checksum ChunkSums caches (and the tcp codec's block
// checksum): XXH3-64.
func Sum(p []byte) uint64 { return xxh3.Hash(p) }

// Summed is an optional capability of a Buffer whose bytes no longer
// change (a sealed object's pin): ChunkSums returns the cache of its
// blocks' checksums, or nil when the bytes may still change (a borrowed
// buffer not sealed, device memory), which senders then checksum as they go.
type Summed interface {
	ChunkSums() *ChunkSums
}

// SumsOf returns b's checksum cache, nil if it has none.
func SumsOf(b Buffer) *ChunkSums {
	if s, ok := b.(Summed); ok {
		return s.ChunkSums()
	}
	return nil
}
