package tensor

import (
	"sync"
	"testing"
)

func TestChunkSums(t *testing.T) {
	const base = 4096
	p := make([]byte, 2*SumChunk+1000)
	for i := range p {
		p[i] = byte(i*13 + i>>9)
	}
	tests := []struct {
		name string
		fill func(c *ChunkSums) []byte // returns the bytes the sums are of
	}{
		{"Fill", func(c *ChunkSums) []byte { c.Fill(p); return p }},
		{"Copy", func(c *ChunkSums) []byte {
			dst := make([]byte, len(p))
			if n := c.Copy(dst, p); n != len(p) {
				t.Fatalf("Copy copied %d of %d", n, len(p))
			}
			return dst
		}},
		{"Set", func(c *ChunkSums) []byte {
			for off := 0; off < len(p); off += SumChunk {
				b := p[off:min(off+SumChunk, len(p))]
				c.Set(base+int64(off), len(b), Sum(b))
			}
			return p
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewChunkSums(base, base+int64(len(p)))
			if _, ok := c.Get(base, SumChunk); ok {
				t.Fatal("an empty cache knows a sum")
			}
			got := tc.fill(c)
			if string(got) != string(p) {
				t.Fatal("the bytes changed")
			}
			if k, n := c.Known(); k != 3 || n != 3 {
				t.Fatalf("Known = %d of %d, want 3 of 3", k, n)
			}
			for off := 0; off < len(p); off += SumChunk {
				b := p[off:min(off+SumChunk, len(p))]
				s, ok := c.Get(base+int64(off), len(b))
				if !ok || s != Sum(b) {
					t.Fatalf("block at %d: %#x %v, want %#x", off, s, ok, Sum(b))
				}
			}
		})
	}
	// Ranges off the grid are neither answered nor recorded.
	c := NewChunkSums(base, base+int64(len(p)))
	c.Fill(p)
	for _, r := range []struct {
		off int64
		n   int
	}{
		{0, SumChunk},                 // before base
		{base + 1, SumChunk},          // off the grid
		{base, SumChunk / 2},          // part of a block
		{base, 2 * SumChunk},          // two blocks
		{base + 2*SumChunk, 999},      // the tail, short
		{base + 3*SumChunk, 1},        // past the end
		{base + 2*SumChunk, SumChunk}, // the tail, too long
	} {
		if _, ok := c.Get(r.off, r.n); ok {
			t.Errorf("Get(%d, %d) answered", r.off, r.n)
		}
	}
	empty := NewChunkSums(base, base+int64(len(p)))
	empty.Set(base+1, SumChunk, 1)
	if k, _ := empty.Known(); k != 0 {
		t.Errorf("a Set off the grid was recorded")
	}
	var nilSums *ChunkSums
	if _, ok := nilSums.Get(base, SumChunk); ok {
		t.Error("a nil cache answered")
	}
}

func TestChunkSumsConcurrent(t *testing.T) {
	p := make([]byte, 8*SumChunk)
	for i := range p {
		p[i] = byte(i)
	}
	c := NewChunkSums(0, int64(len(p)))
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for off := 0; off < len(p); off += SumChunk {
				if s, ok := c.Get(int64(off), SumChunk); ok && s != Sum(p[off:off+SumChunk]) {
					t.Errorf("block %d: a stale sum", off)
				}
				c.Set(int64(off), SumChunk, Sum(p[off:off+SumChunk]))
			}
		}()
	}
	wg.Wait()
}
