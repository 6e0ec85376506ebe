package tensor

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// gatherCase lays parts of the given sizes into a destination, gap bytes
// apart (padding), and returns the destination's size.
func gatherCase(rng *rand.Rand, sizes []int, gap int) ([]GatherPart, int) {
	var parts []GatherPart
	at := 0
	for _, n := range sizes {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		parts = append(parts, GatherPart{Src: src, At: int64(at)})
		at += n + gap
	}
	return parts, at
}

func TestGather(t *testing.T) {
	tests := []struct {
		name    string
		sizes   []int
		gap     int
		workers int
	}{
		{"one part, one block", []int{1000}, 0, 4},
		{"one part, many blocks", []int{3*SumChunk + 17}, 0, 3},
		{"parts across block edges", []int{SumChunk - 1, 2, SumChunk + 5, 1, 7 * SumChunk / 3}, 0, 2},
		{"a part per block and more workers than blocks", []int{SumChunk, SumChunk}, 0, 8},
		{"padding between parts", []int{100, 5000, SumChunk, 3}, 64, 4},
		{"many small parts", []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 4096, 65536, 1, SumChunk * 2}, 3, 2},
		{"default workers", []int{5 * SumChunk}, 0, 0},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			parts, n := gatherCase(rng, tc.sizes, tc.gap)
			dst := make([]byte, n)
			for i := range dst {
				dst[i] = 0xAB // padding keeps what was there
			}
			want := bytes.Clone(dst)
			for _, p := range parts {
				copy(want[p.At:], p.Src)
			}
			rng.Shuffle(len(parts), func(i, j int) { parts[i], parts[j] = parts[j], parts[i] })
			plain := bytes.Clone(dst)
			if err := Gather(plain, parts, tc.workers, nil); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(plain, want) {
				t.Fatal("gathered bytes (no sums) differ from the parts copied one by one")
			}
			c := NewChunkSums(0, int64(n))
			if err := Gather(dst, parts, tc.workers, c); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dst, want) {
				t.Fatal("gathered bytes differ from the parts copied one by one")
			}
			if known, blocks := c.Known(); known != blocks {
				t.Fatalf("%d of %d blocks summed", known, blocks)
			}
			ref := NewChunkSums(0, int64(n))
			ref.Fill(want)
			for off := 0; off < n; off += SumChunk {
				l := min(SumChunk, n-off)
				got, _ := c.Get(int64(off), l)
				exp, _ := ref.Get(int64(off), l)
				if got != exp {
					t.Fatalf("block at %d: sum %x, want %x", off, got, exp)
				}
			}
		})
	}
}

func TestGatherRefusesBadParts(t *testing.T) {
	src := make([]byte, 100)
	tests := []struct {
		name  string
		sums  *ChunkSums
		parts []GatherPart
	}{
		{"past the end", NewChunkSums(0, 1000), []GatherPart{{Src: src, At: 950}}},
		{"negative offset", NewChunkSums(0, 1000), []GatherPart{{Src: src, At: -1}}},
		{"overlapping", NewChunkSums(0, 1000), []GatherPart{{Src: src, At: 0}, {Src: src, At: 99}}},
		{"overlapping, given out of order", NewChunkSums(0, 1000), []GatherPart{{Src: src, At: 150}, {Src: src, At: 100}}},
		{"sums of other bytes", NewChunkSums(4096, 4096+1000), []GatherPart{{Src: src, At: 0}}},
		{"sums of a shorter range", NewChunkSums(0, 999), []GatherPart{{Src: src, At: 0}}},
		{"past the end, no sums", nil, []GatherPart{{Src: src, At: 901}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]byte, 1000)
			err := Gather(dst, tc.parts, 2, tc.sums)
			if !errors.Is(err, ErrBadDesc) {
				t.Fatalf("err %v, want ErrBadDesc", err)
			}
			if !bytes.Equal(dst, make([]byte, 1000)) {
				t.Fatal("a refused gather wrote into the destination")
			}
		})
	}
}

func BenchmarkGather(b *testing.B) {
	const n = 64 << 20
	parts, total := gatherCase(rand.New(rand.NewPCG(3, 4)), []int{n / 4, n / 4, n / 4, n / 4}, 64)
	dst := make([]byte, total)
	b.SetBytes(n)
	for b.Loop() {
		if err := Gather(dst, parts, 0, NewChunkSums(0, int64(total))); err != nil {
			b.Fatal(err)
		}
	}
}
