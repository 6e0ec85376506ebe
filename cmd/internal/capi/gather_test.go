package capi

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/tensor"
)

// A state dict copied by PutGathered is sealed: over tcp its checksums are
// computed at most once. The first such block, before the owner served any
// network read, leaves them to its first read (stored) and later reads use
// them (cached); once the owner has served one, the copy computes them as
// it goes, and no read of the block reads its memory for them. The reader
// gets every part at its offset.
func TestPutGatheredSealsItsCopy(t *testing.T) {
	_, a, b := pair(t, `{"allow_transports":["tcp"]}`)
	ctx := context.Background()
	rng := rand.NewChaCha8([32]byte{1})
	sizes := []int{3 << 20, 1000, 1 << 20, 5} // parts across 256 KiB blocks, and one inside one
	const align = 64
	var parts []GatherPart
	total := 0
	for _, n := range sizes {
		// Random bytes: the tcp codec's sample finds nothing to compress, so
		// every block goes raw with its checksum whatever the link measured.
		src := make([]byte, n)
		rng.Read(src)
		parts = append(parts, GatherPart{Src: src, At: int64(total)})
		total += (n + align - 1) / align * align
	}
	blocks := int64((total + tensor.SumChunk - 1) / tensor.SumChunk)
	read := func(ref []byte) {
		t.Helper()
		dst := make([]byte, total)
		x, err := b.GetInto(ctx, ref, dst, 0, 0)
		require.NoError(t, err)
		assert.Equal(t, "tcp", x.Stats.Transport)
		for i, part := range parts {
			assert.Equal(t, part.Src, dst[part.At:part.At+int64(len(part.Src))], "part %d", i)
		}
	}
	put := func() (unsafe.Pointer, []byte) {
		t.Helper()
		p, err := a.Alloc(ctx, int64(total))
		require.NoError(t, err)
		ref, err := a.PutGathered(ctx, unsafe.Slice((*byte)(p), total), parts, 2)
		require.NoError(t, err)
		return p, ref
	}
	sums := func() map[string]int64 { return a.Stats().TCPOwnerChecksums }

	p1, first := put()
	read(first)
	assert.Equal(t, map[string]int64{"cached": 0, "stored": blocks, "computed": 0}, sums(), "the first network read computes and stores")
	read(first)
	assert.Equal(t, map[string]int64{"cached": blocks, "stored": blocks, "computed": 0}, sums(), "the next one uses them")

	p2, second := put()
	read(second)
	assert.Equal(t, map[string]int64{"cached": 2 * blocks, "stored": blocks, "computed": 0}, sums(), "the copy computed them")

	s := a.Stats()
	assert.Equal(t, int64(2), s.GatheredPuts)
	assert.Equal(t, int64(1), s.GatheredSummed)
	assert.Equal(t, int64(2), s.ForeignPuts, "copies the runtime made")
	for _, ref := range [][]byte{first, second} {
		require.NoError(t, b.Release(ctx, ref))
		require.NoError(t, a.Free(ctx, ref, 5*time.Second))
	}
	require.NoError(t, a.FreeMemory(p1))
	require.NoError(t, a.FreeMemory(p2))
}

func TestPutGatheredRefusesBadInput(t *testing.T) {
	_, a, _ := pair(t, `{"allow_transports":["tcp"]}`)
	ctx := context.Background()
	p, err := a.Alloc(ctx, 1<<20)
	require.NoError(t, err)
	defer a.FreeMemory(p)
	block := unsafe.Slice((*byte)(p), 1<<20)
	src := pattern(1000)
	tests := []struct {
		name  string
		block []byte
		parts []GatherPart
	}{
		{"empty block", nil, nil},
		{"memory the runtime did not allocate", make([]byte, 4096), []GatherPart{{Src: src, At: 0}}},
		{"block runs past its allocation", unsafe.Slice((*byte)(p), 2<<20), nil},
		{"part past the block", block, []GatherPart{{Src: src, At: 1<<20 - 10}}},
		{"overlapping parts", block, []GatherPart{{Src: src, At: 0}, {Src: src, At: 500}}},
		{"negative offset", block, []GatherPart{{Src: src, At: -1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.PutGathered(ctx, tc.block, tc.parts, 0)
			require.Error(t, err)
			assert.Equal(t, "invalid_argument", Kinds[Code(err)], "%v", err)
		})
	}
	assert.Equal(t, 0, a.Stats().Objects, "nothing published")
	assert.Equal(t, int64(0), a.Stats().GatheredPuts)
}
