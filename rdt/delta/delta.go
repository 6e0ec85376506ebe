// Package delta encodes a tensor's new version against the version a
// reader already holds, for weight sync over links slower than the codec.
// Most bf16 weights are bitwise unchanged by one optimizer step at the
// learning rates of RL post-training (1e-6 to 1e-5): the step is smaller
// than a bf16 ulp for most weights. So the sender compares the two
// versions 8-byte word by word and sends only the words that changed: a
// bit per 32 KiB chunk (an unchanged chunk costs that bit and nothing
// more), a bit per word in the chunks that changed, and the changed words'
// XOR with the previous version in byte planes, entropy-coded (huff0, as
// the tcp codec: the high byte of a bf16 holds sign and exponent and its
// XOR is almost always zero; the low byte holds the mantissa bits that
// flip). The reader XORs the words into its copy. Coding costs a compare
// of the two versions plus work in proportion to what changed (sparse.go;
// the first format, v1, XORed every element into full-size planes and ran
// zstd over all of them, and is still decoded).
//
// Every delta says which base it was made against and what it produces
// (XXH3-64 of both): Decode refuses a base that is not the reader's
// previous version (ErrBaseMismatch) and leaves it untouched, and checks
// the result against the sender's bytes (ErrCorrupt, the base restored),
// so a delta transfer is verified against what a full transfer would have
// delivered.
package delta

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/zeebo/xxh3"
)

// Errors.
var (
	// ErrBaseMismatch: the reader's bytes are not the version the delta
	// was made against (it missed a step, or joined late): send it whole.
	ErrBaseMismatch = errors.New("delta: the base is not the version the delta was made against")
	// ErrCorrupt: the delta is malformed, or decoding it did not give the
	// sender's bytes.
	ErrCorrupt = errors.New("delta: corrupt")
)

const (
	magic      = "TLD1"
	headerSize = 4 + 1 + 8 + 8 + 8 // magic, element size, length, base and result checksums
	maxLen     = 1 << 40
)

var (
	encOnce sync.Once
	enc     *zstd.Encoder
	dec     *zstd.Decoder
)

// planes keeps plane buffers between calls: a state dict's tensors are
// encoded and decoded every step at the same sizes, and a fresh buffer per
// tensor is fresh pages for the kernel to fault in and zero each time. One
// pool per power of two of capacity: with one pool for every size, a
// tensor's large buffers and small ones displaced each other and most
// calls allocated afresh.
var planes [48]sync.Pool // of *[]byte, pool c holding capacity 1<<c

// planesBuf returns a buffer of n bytes (capacity a power of two), zeroed
// if zero is set.
func planesBuf(n int, zero bool) []byte {
	c := bits.Len(uint(max(n, 1) - 1))
	if p, ok := planes[c].Get().(*[]byte); ok {
		b := (*p)[:n]
		if zero {
			clear(b)
		}
		return b
	}
	return make([]byte, n, 1<<c)
}

// putPlanes keeps b for a later planesBuf (only buffers it made: their
// capacity is a power of two).
func putPlanes(b []byte) {
	if c := bits.Len(uint(cap(b))) - 1; c >= 0 && c < len(planes) && cap(b) == 1<<c {
		planes[c].Put(&b)
	}
}

func coders() (*zstd.Encoder, *zstd.Decoder) {
	encOnce.Do(func() {
		// Both are safe for concurrent EncodeAll/DecodeAll; one each for
		// the process (they hold no goroutines with concurrency 1).
		// No zstd checksum: the header's XXH3 of the result checks more
		// (the bytes after applying), and the frame's own hash cost a tenth
		// of the encoding.
		enc, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1),
			zstd.WithEncoderCRC(false))
		dec, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxLen))
	})
	return enc, dec
}

// Stats describes one encoding.
type Stats struct {
	Raw, Encoded int64 // bytes of the tensor, bytes of the delta
	Changed      int64 // elements whose bits changed
}

// Ratio is how many times fewer bytes the delta is than the tensor.
func (s Stats) Ratio() float64 {
	if s.Encoded == 0 {
		return 0
	}
	return float64(s.Raw) / float64(s.Encoded)
}

// Encode appends to dst the delta that turns prev into cur (equal lengths,
// elements of elem bytes: 1, 2, 4 or 8), in the sparse format (v2): its
// cost is a compare of the two versions word by word plus coding the
// changed words; it appends at most Bound(len(cur)) bytes.
func Encode(dst, prev, cur []byte, elem int) ([]byte, Stats, error) {
	if err := checkArgs(prev, cur, elem); err != nil {
		return dst, Stats{}, err
	}
	d, st := encodeV2(dst, prev, cur, elem, false)
	return d, st, nil
}

// EncodeAdvance is Encode, and prev becomes cur: a publisher that keeps
// the last version to encode the next against copies each chunk over while
// it is in cache from the compare, not in a second pass over both versions
// (cur must not change meanwhile).
func EncodeAdvance(dst, prev, cur []byte, elem int) ([]byte, Stats, error) {
	if err := checkArgs(prev, cur, elem); err != nil {
		return dst, Stats{}, err
	}
	d, st := encodeV2(dst, prev, cur, elem, true)
	return d, st, nil
}

func checkArgs(prev, cur []byte, elem int) error {
	if len(prev) != len(cur) {
		return fmt.Errorf("delta: base of %d bytes, new version of %d", len(prev), len(cur))
	}
	if elem != 1 && elem != 2 && elem != 4 && elem != 8 {
		return fmt.Errorf("delta: element size %d", elem)
	}
	return nil
}

// encodeV1 appends the v1 delta (full-size XOR planes, zstd): what Encode
// wrote before v2, kept so that Decode's v1 path stays tested and the
// benchmarks can put the two side by side.
func encodeV1(dst, prev, cur []byte, elem int) ([]byte, Stats, error) {
	if err := checkArgs(prev, cur, elem); err != nil {
		return dst, Stats{}, err
	}
	n := len(cur)
	// One pass: the XOR, straight into its byte planes.
	buf := planesBuf(n, true)
	defer putPlanes(buf)
	changed := xorPlanes(buf, prev, cur, elem)
	h := make([]byte, headerSize)
	copy(h, magic)
	h[4] = byte(elem)
	binary.LittleEndian.PutUint64(h[5:], uint64(n))
	binary.LittleEndian.PutUint64(h[13:], xxh3.Hash(prev))
	binary.LittleEndian.PutUint64(h[21:], xxh3.Hash(cur))
	start := len(dst)
	dst = append(dst, h...)
	e, _ := coders()
	dst = e.EncodeAll(buf, dst)
	return dst, Stats{Raw: int64(n), Encoded: int64(len(dst) - start), Changed: changed}, nil
}

// Check reports whether base is the version d was made against (and d
// looks like a delta), without changing anything: a reader applying the
// deltas of a whole state dict checks every base first, so it never ends
// with some tensors at the new version and some at the old.
func Check(base, d []byte) error {
	if len(d) < headerSize || (string(d[:4]) != magic && string(d[:4]) != magicV2) {
		return fmt.Errorf("%w: no delta header", ErrCorrupt)
	}
	if n := binary.LittleEndian.Uint64(d[5:]); n != uint64(len(base)) {
		return fmt.Errorf("%w: a delta for %d bytes applied to %d", ErrCorrupt, n, len(base))
	}
	if xxh3.Hash(base) != binary.LittleEndian.Uint64(d[13:]) {
		return ErrBaseMismatch
	}
	return nil
}

// Decode applies the delta d to base in place: base becomes the sender's
// new version. On any error base is as it was.
func Decode(base, d []byte) error { return apply(base, d, sumBase, sumResult) }

// Revert undoes Decode: base must be d's result (ErrBaseMismatch
// otherwise) and becomes the version d was made against, checked against
// d's checksum of it. A reader applying the deltas of a whole state dict
// one by one reverts those it applied when a later one fails, so it never
// ends with a mix of two versions without hashing every base twice (Check
// of all, then Decode of each).
func Revert(base, d []byte) error { return apply(base, d, sumResult, sumBase) }

// Offsets of the two checksums in both formats' headers.
const (
	sumBase   = 13
	sumResult = 21
)

// apply XORs d into base, which must hash to the checksum at offset from
// in d's header, and checks the result against the one at offset to; on
// any error base is as it was.
func apply(base, d []byte, from, to int) error {
	if len(d) < headerSize || (string(d[:4]) != magic && string(d[:4]) != magicV2) {
		return fmt.Errorf("%w: no delta header", ErrCorrupt)
	}
	elem := int(d[4])
	n := binary.LittleEndian.Uint64(d[5:])
	if (elem != 1 && elem != 2 && elem != 4 && elem != 8) || n != uint64(len(base)) {
		return fmt.Errorf("%w: a delta of %d-byte elements for %d bytes applied to %d", ErrCorrupt, elem, n, len(base))
	}
	want := binary.LittleEndian.Uint64(d[to:])
	if string(d[:4]) == magicV2 {
		// It checks the base in the same pass as it applies the words.
		return decodeV2(base, d, binary.LittleEndian.Uint64(d[from:]), want)
	}
	if xxh3.Hash(base) != binary.LittleEndian.Uint64(d[from:]) {
		return ErrBaseMismatch
	}
	_, z := coders()
	pl, err := z.DecodeAll(d[headerSize:], planesBuf(len(base), false)[:0])
	if err != nil || len(pl) != len(base) {
		return fmt.Errorf("%w: %d bytes decoded for %d (%v)", ErrCorrupt, len(pl), len(base), err)
	}
	defer putPlanes(pl)
	applyPlanes(base, pl, elem)
	if xxh3.Hash(base) != want {
		applyPlanes(base, pl, elem) // XOR is its own inverse: the base is restored
		return fmt.Errorf("%w: the result does not match the sender's checksum", ErrCorrupt)
	}
	return nil
}

// xorPlanes writes cur XOR prev into dst as byte planes (plane k holds byte
// k of every element; a trailing partial element goes last, as it is) and
// counts the elements that changed. dst must be zeroed: words of cur equal
// to prev's (most of a bf16 step's) are skipped, not written.
func xorPlanes(dst, prev, cur []byte, elem int) int64 {
	m := len(cur) / elem
	var changed int64
	if elem == 2 { // bf16 and fp16, the common case
		lo, hi := dst[:m], dst[m:2*m]
		i := 0
		for ; i+4 <= m; i += 4 { // four elements, one 8-byte word
			if binary.LittleEndian.Uint64(cur[2*i:]) == binary.LittleEndian.Uint64(prev[2*i:]) {
				continue
			}
			for k := i; k < i+4; k++ {
				a, b := cur[2*k]^prev[2*k], cur[2*k+1]^prev[2*k+1]
				lo[k], hi[k] = a, b
				if a|b != 0 {
					changed++
				}
			}
		}
		for ; i < m; i++ {
			a, b := cur[2*i]^prev[2*i], cur[2*i+1]^prev[2*i+1]
			lo[i], hi[i] = a, b
			if a|b != 0 {
				changed++
			}
		}
	} else {
		for i := range m {
			var any byte
			for k := range elem {
				x := cur[i*elem+k] ^ prev[i*elem+k]
				dst[k*m+i] = x
				any |= x
			}
			if any != 0 {
				changed++
			}
		}
	}
	for i := m * elem; i < len(cur); i++ {
		dst[i] = cur[i] ^ prev[i]
	}
	return changed
}

// applyPlanes XORs byte planes (as xorPlanes made them) into base,
// skipping runs of four elements whose planes are zero.
func applyPlanes(base, planes []byte, elem int) {
	m := len(base) / elem
	if elem == 2 {
		lo, hi := planes[:m], planes[m:2*m]
		i := 0
		for ; i+4 <= m; i += 4 {
			if binary.LittleEndian.Uint32(lo[i:])|binary.LittleEndian.Uint32(hi[i:]) == 0 {
				continue
			}
			for k := i; k < i+4; k++ {
				base[2*k] ^= lo[k]
				base[2*k+1] ^= hi[k]
			}
		}
		for ; i < m; i++ {
			base[2*i] ^= lo[i]
			base[2*i+1] ^= hi[i]
		}
	} else {
		for i := range m {
			for k := range elem {
				base[i*elem+k] ^= planes[k*m+i]
			}
		}
	}
	for i := m * elem; i < len(base); i++ {
		base[i] ^= planes[i]
	}
}

// Worth says whether sending a delta beats sending the tensor whole: the
// delta's bytes at the link's rate plus the encoding and decoding (at
// codecBps bytes of tensor per second each, on their own cores, overlapped
// with nothing) against the whole tensor at the link's rate. This is the
// tcp codec's rule (use it when the link is slower than the codec), with
// the delta's ratio in it.
func Worth(raw, encoded int64, linkBps, codecBps float64) bool {
	if linkBps <= 0 || codecBps <= 0 || raw <= 0 {
		return false
	}
	whole := float64(raw) / linkBps
	delta := float64(encoded)/linkBps + 2*float64(raw)/codecBps
	return delta < whole
}
