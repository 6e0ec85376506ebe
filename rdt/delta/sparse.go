package delta

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/tensorlane/tensorlane/internal/tcodec"
)

// The sparse format (v2, "TLD2"), which Encode writes: the work is
// proportional to the changed words, not to the tensor. The tensor is
// read as 8-byte words in chunks of chunkWords; a chunk with no changed
// word costs one bit of the chunk map and nothing else, and a changed
// chunk costs its word map (one bit per word) and the XOR of its changed
// words. v1 ("TLD1") XORed every element into full-size byte planes and
// ran zstd over all of them (XOR, zero-fill and zstd cost the whole
// tensor at both ends); Decode still reads it.
//
//	header:    "TLD2" | elem (1) | n (8) | xxh3 of base (8) | xxh3 of result (8) |
//	           bytes of word maps (8) | bytes of lane maps (8) | bytes of elements (8)   little-endian
//	chunk map: one bit per chunk, ceil(chunks/8) bytes, raw
//	word maps: chunkWords/8 bytes per changed chunk, as tcodec blocks (one byte plane, huff0)
//	lane maps: per changed word, a bit per element (8/elem bits; none for 8-byte elements),
//	           as tcodec blocks (one byte plane, huff0)
//	elements:  the changed elements' XOR, as tcodec blocks (byte planes of elem, huff0)
//	tail:      the XOR of the last n%8 bytes, raw
//
// Only changed elements are coded, not whole words: after an Adam step at
// lr 1e-5 a third of the words change but only one element in three of
// those, and the entropy coder's time is in proportion to its input.
//
// The word maps and words are tcodec blocks (internal/tcodec, what the tcp
// transport sends compressed): each carries the XXH3 of its raw bytes, so a
// damaged delta is caught before it touches the base.
const (
	magicV2    = "TLD2"
	headerV2   = 4 + 1 + 8 + 8 + 8 + 8 + 8 + 8
	chunkWords = 4096 // 32 KiB of tensor per chunk-map bit
	chunkMap   = chunkWords / 8
)

// Bound is the most bytes Encode appends for a tensor of n bytes (the
// header, the chunk map, the word maps and every word raw, and tcodec's
// block headers), so a caller can size the output once.
func Bound(n int64) int64 {
	words := n / 8
	chunks := (words + chunkWords - 1) / chunkWords
	maps := chunks * chunkMap
	blocks := (maps+n)/tcodec.MaxBlock + 2
	lanes := n / 8 // a bit per element of every word, at most
	return headerV2 + (chunks+7)/8 + maps + lanes + n + (blocks+1)*tcodec.HeaderSize + 64
}

var (
	encoders = sync.Pool{New: func() any { return tcodec.NewEncoder() }}
	decoders = sync.Pool{New: func() any { return tcodec.NewDecoder() }}
)

// encodeV2 appends the sparse delta of prev -> cur to dst. One pass over
// both versions, chunk by chunk: each chunk is hashed (both checksums,
// streaming) and compared while it is in cache; where many words change
// (a changed word's position is unpredictable: 2-60% of words change after
// an Adam step) the compare has no branch per word.
func encodeV2(dst, prev, cur []byte, elem int, advance bool) ([]byte, Stats) {
	n := len(cur)
	words := n / 8
	chunks := (words + chunkWords - 1) / chunkWords
	cmap := make([]byte, (chunks+7)/8)
	// The word maps and the gathered words, in pooled buffers: sized by
	// what changed (at most the tensor), reused across a state dict.
	maps := planesBuf(chunks*chunkMap, false)[:0]
	xs := planesBuf(8*words, false)[:0] // room for every word: it never grows
	hp, hc := xxh3.New(), xxh3.New()
	var changed int64
	sparse := true
	for c := range chunks {
		w0, w1 := c*chunkWords, min((c+1)*chunkWords, words)
		p, q := prev[8*w0:8*w1], cur[8*w0:8*w1]
		hp.Write(p)
		hc.Write(q)
		j := len(xs) / 8
		// Each word of the chunk is written, and kept (j moves on) only
		// when it changed: xs has room for every word of the tensor.
		k0 := len(xs)
		xs = xs[:cap(xs)]
		var wm [chunkWords / 64]uint64
		if sparse {
			// Few changed words: a branch per word, mostly not taken, is
			// cheaper than writing every word.
			for i := 0; i < w1-w0; i++ {
				x := binary.LittleEndian.Uint64(q[8*i:]) ^ binary.LittleEndian.Uint64(p[8*i:])
				if x == 0 {
					continue
				}
				binary.LittleEndian.PutUint64(xs[8*j:], x)
				j++
				wm[i>>6] |= 1 << (i & 63)
			}
		} else {
			// Many: no branch per word (it would be mispredicted often).
			for i := 0; i < w1-w0; i++ {
				x := binary.LittleEndian.Uint64(q[8*i:]) ^ binary.LittleEndian.Uint64(p[8*i:])
				nz := (x | -x) >> 63 // 1 when the word changed
				binary.LittleEndian.PutUint64(xs[8*j:], x)
				j += int(nz)
				wm[i>>6] |= nz << (i & 63)
			}
		}
		// The next chunk's loop, by this one's density (an eighth of words
		// changed is about where the two cost the same here).
		sparse = 8*(j-k0/8) < w1-w0
		xs = xs[:8*j]
		var any uint64
		for _, m := range wm {
			any |= m
		}
		if any != 0 {
			cmap[c>>3] |= 1 << (c & 7)
			for _, m := range wm {
				maps = binary.LittleEndian.AppendUint64(maps, m)
			}
			if advance { // an unchanged chunk is cur's already
				copy(p, q)
			}
		}
	}
	tail := make([]byte, n-8*words)
	hp.Write(prev[8*words:])
	hc.Write(cur[8*words:])
	for i := range tail {
		tail[i] = cur[8*words+i] ^ prev[8*words+i]
	}
	if advance {
		copy(prev[8*words:], cur[8*words:])
	}
	// Whole elements of the tail that changed.
	for i := 0; i+elem <= len(tail); i += elem {
		for k := range elem {
			if tail[i+k] != 0 {
				changed++
				break
			}
		}
	}

	lm, es := splitLanes(xs, elem)
	changed += int64(len(es) / elem) // the changed elements of whole words
	e := encoders.Get().(*tcodec.Encoder)
	defer encoders.Put(e)
	start := len(dst)
	dst = append(dst, make([]byte, headerV2)...)
	h := dst[start:]
	copy(h, magicV2)
	h[4] = byte(elem)
	binary.LittleEndian.PutUint64(h[5:], uint64(n))
	binary.LittleEndian.PutUint64(h[13:], hp.Sum64())
	binary.LittleEndian.PutUint64(h[21:], hc.Sum64())
	dst = append(dst, cmap...)
	m0 := len(dst)
	dst = appendBlocks(e, dst, maps, tcodec.Hint{Elem: 1, Float: true})
	l0 := len(dst)
	dst = appendBlocks(e, dst, lm, tcodec.Hint{Elem: 1, Float: true})
	e0 := len(dst)
	dst = appendBlocks(e, dst, es, tcodec.Hint{Elem: elem, Float: true})
	h = dst[start:]
	binary.LittleEndian.PutUint64(h[29:], uint64(l0-m0))
	binary.LittleEndian.PutUint64(h[37:], uint64(e0-l0))
	binary.LittleEndian.PutUint64(h[45:], uint64(len(dst)-e0))
	dst = append(dst, tail...)
	putPlanes(maps)
	if elem != 8 {
		putPlanes(es)
	}
	putPlanes(xs)
	return dst, Stats{Raw: int64(n), Encoded: int64(len(dst) - start), Changed: changed}
}

// splitLanes splits the changed words xs into a bit per element (set where
// it changed) and the changed elements. 8-byte elements need no lane maps:
// every changed word is one changed element.
//
// Per word, the changed lanes are packed into one register (an unchanged
// lane is zero, so OR-ing it in at the current shift adds nothing and the
// shift moves on only past a changed one) and stored as one 8-byte word at
// the next element's place; the lane bits gather in a register and are
// stored 64 at a time. Both without a branch per lane (a quarter to a
// half of the lanes change where it matters, at random) and without a
// read-modify-write of memory per lane, which had made the loop wait on
// its own stores (splitLanesRef, the loop it replaced, is the tests'
// reference).
func splitLanes(xs []byte, elem int) (lm, es []byte) {
	if elem == 8 {
		return nil, xs
	}
	lanes := 8 / elem
	nw := len(xs) / 8
	// Whole 8-byte words of lane bits, so the register can be stored whole.
	lm = make([]byte, (nw*lanes+63)/64*8)
	es = planesBuf(len(xs)+8, false)
	width := uint(8 * elem)
	mask := uint64(1)<<width - 1
	var acc uint64 // lane bits not yet stored
	bit, e := uint(0), 0
	for k := range nw {
		x := binary.LittleEndian.Uint64(xs[8*k:])
		var y, m uint64
		s := uint(0)
		if elem == 2 { // bf16 and fp16: the loop below, unrolled
			v0, v1, v2, v3 := x&0xffff, x>>16&0xffff, x>>32&0xffff, x>>48
			n0, n1, n2, n3 := (v0|-v0)>>63, (v1|-v1)>>63, (v2|-v2)>>63, (v3|-v3)>>63
			y = v0
			s = 16 * uint(n0)
			y |= v1 << s
			s += 16 * uint(n1)
			y |= v2 << s
			s += 16 * uint(n2)
			y |= v3 << s
			s += 16 * uint(n3)
			m = n0 | n1<<1 | n2<<2 | n3<<3
		} else {
			for l := range uint(lanes) {
				v := x >> (width * l) & mask
				nz := (v | -v) >> 63
				y |= v << s
				s += width * uint(nz)
				m |= nz << l
			}
		}
		binary.LittleEndian.PutUint64(es[e:], y)
		e += int(s / 8)
		acc |= m << (bit & 63)
		bit += uint(lanes)
		if bit&63 == 0 {
			binary.LittleEndian.PutUint64(lm[bit/8-8:], acc)
			acc = 0
		}
	}
	if bit&63 != 0 {
		binary.LittleEndian.PutUint64(lm[bit/64*8:], acc)
	}
	return lm[:(nw*lanes+7)/8], es[:e]
}

// splitLanesRef is splitLanes as first written (a store per lane and a
// read-modify-write of the lane map per lane): the tests' reference.
func splitLanesRef(xs []byte, elem int) (lm, es []byte) {
	if elem == 8 {
		return nil, xs
	}
	lanes := 8 / elem
	nw := len(xs) / 8
	lm = make([]byte, (nw*lanes+7)/8)
	es = make([]byte, len(xs)+8)
	mask := uint64(1)<<(8*elem) - 1
	bit, e := 0, 0
	for k := range nw {
		x := binary.LittleEndian.Uint64(xs[8*k:])
		for l := range lanes {
			v := x >> (8 * elem * l) & mask
			nz := (v | -v) >> 63
			binary.LittleEndian.PutUint64(es[e:], v)
			e += int(nz) * elem
			lm[bit>>3] |= byte(nz) << (bit & 7)
			bit++
		}
	}
	return lm, es[:e]
}

// appendBlocks appends p as tcodec blocks of at most MaxBlock bytes (whole
// 8-byte words each, so every block's planes line up).
func appendBlocks(e *tcodec.Encoder, dst, p []byte, hint tcodec.Hint) []byte {
	for off := 0; off < len(p); off += tcodec.MaxBlock {
		// Encode cannot fail for a block within MaxBlock.
		dst, _ = e.AppendBlock(dst, p[off:min(off+tcodec.MaxBlock, len(p))], hint)
	}
	return dst
}

// xorChunk2 XORs the changed words of one chunk of bf16 (or fp16) into b:
// wm its word map, lm the lane maps and es the changed elements (with 8
// bytes of slack) from changed word j and element e on, which it returns
// advanced. Its own function, not decodeV2's closure: there, with every
// variable of decodeV2 live, the loop spilled to the stack.
func xorChunk2(b, wm, lm, es []byte, j, e int) (int, int) {
	for i := 0; i+8 <= len(wm); i += 8 {
		m := binary.LittleEndian.Uint64(wm[i:])
		for m != 0 {
			w := 8*i + bits.TrailingZeros64(m)
			m &= m - 1
			// Lane l takes the low element of y when its bit is set and
			// shifts it off: no branch per lane.
			lb := uint64(lm[j>>1]>>(4*(j&1))) & 0xf
			y := binary.LittleEndian.Uint64(es[2*e:])
			b0, b1, b2, b3 := lb&1, lb>>1&1, lb>>2&1, lb>>3
			x := y & 0xffff & -b0
			y >>= 16 * b0
			x |= (y & 0xffff & -b1) << 16
			y >>= 16 * b1
			x |= (y & 0xffff & -b2) << 32
			y >>= 16 * b2
			x |= (y & 0xffff & -b3) << 48
			e += int(b0 + b1 + b2 + b3)
			j++
			binary.LittleEndian.PutUint64(b[8*w:], binary.LittleEndian.Uint64(b[8*w:])^x)
		}
	}
	return j, e
}

// readBlocks decodes the tcodec blocks of in into exactly want bytes.
func readBlocks(dec *tcodec.Decoder, in []byte, want int) ([]byte, error) {
	// 8 bytes of slack past want: decodeV2 loads elements 8 bytes at a time.
	out := planesBuf(want+8, false)[:want]
	at := 0
	for len(in) > 0 {
		h, err := tcodec.ParseHeader(in)
		if err != nil {
			putPlanes(out)
			return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		in = in[tcodec.HeaderSize:]
		if h.EncLen > len(in) || h.RawLen > want-at {
			putPlanes(out)
			return nil, fmt.Errorf("%w: a block of %d/%d bytes past the delta's end", ErrCorrupt, h.RawLen, h.EncLen)
		}
		if err := dec.Decode(out[at:at+h.RawLen], h, in[:h.EncLen]); err != nil {
			putPlanes(out)
			return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		at += h.RawLen
		in = in[h.EncLen:]
	}
	if at != want {
		putPlanes(out)
		return nil, fmt.Errorf("%w: %d bytes decoded for %d", ErrCorrupt, at, want)
	}
	return out, nil
}

// v2 is a parsed sparse delta.
type v2 struct {
	elem                  int
	cmap                  []byte
	maps, lanes, es, tail []byte // encoded word maps, lane maps and elements; the raw tail
}

func parseV2(base, d []byte) (v2, error) {
	if len(d) < headerV2 {
		return v2{}, fmt.Errorf("%w: a header of %d bytes", ErrCorrupt, len(d))
	}
	elem := int(d[4])
	n := binary.LittleEndian.Uint64(d[5:])
	if (elem != 1 && elem != 2 && elem != 4 && elem != 8) || n != uint64(len(base)) {
		return v2{}, fmt.Errorf("%w: a delta of %d-byte elements for %d bytes applied to %d", ErrCorrupt, elem, n, len(base))
	}
	words := len(base) / 8
	chunks := (words + chunkWords - 1) / chunkWords
	cm := uint64((chunks + 7) / 8)
	ml, ll, el := binary.LittleEndian.Uint64(d[29:]), binary.LittleEndian.Uint64(d[37:]), binary.LittleEndian.Uint64(d[45:])
	tl := uint64(len(base) - 8*words)
	rest := uint64(len(d) - headerV2)
	// Each length is checked against what is left, so no sum overflows.
	if cm > rest || ml > rest-cm || ll > rest-cm-ml || el > rest-cm-ml-ll || rest-cm-ml-ll-el != tl {
		return v2{}, fmt.Errorf("%w: sections of %d+%d+%d+%d+%d bytes in %d", ErrCorrupt, cm, ml, ll, el, tl, rest)
	}
	p := d[headerV2:]
	v := v2{elem: elem, cmap: p[:cm]}
	p = p[cm:]
	v.maps, p = p[:ml], p[ml:]
	v.lanes, p = p[:ll], p[ll:]
	v.es, v.tail = p[:el], p[el:]
	if rem := chunks % 8; rem != 0 && v.cmap[cm-1]>>rem != 0 {
		return v2{}, fmt.Errorf("%w: chunk map past the tensor", ErrCorrupt)
	}
	return v, nil
}

// decodeV2 applies d (a v2 delta) to base, which must hash to from, and
// checks the result against want; on error base is as it was.
func decodeV2(base, d []byte, from, want uint64) error {
	v, err := parseV2(base, d)
	if err != nil {
		return err
	}
	words := len(base) / 8
	var nch int
	for _, b := range v.cmap {
		nch += bits.OnesCount8(b)
	}
	dec := decoders.Get().(*tcodec.Decoder)
	defer decoders.Put(dec)
	maps, err := readBlocks(dec, v.maps, nch*chunkMap)
	if err != nil {
		return err
	}
	defer putPlanes(maps)
	var nw int
	for i := 0; i < len(maps); i += 8 {
		nw += bits.OnesCount64(binary.LittleEndian.Uint64(maps[i:]))
	}
	// The last chunk's map names no word past the tensor.
	if last := words % chunkWords; last != 0 && nch > 0 && v.cmap[(words/chunkWords)>>3]&(1<<((words/chunkWords)&7)) != 0 {
		wm := maps[len(maps)-chunkMap:]
		for w := last; w < chunkWords; w++ {
			if wm[w>>3]&(1<<(w&7)) != 0 {
				return fmt.Errorf("%w: word map past the tensor", ErrCorrupt)
			}
		}
	}
	// The lane maps (a bit per element of each changed word) and the
	// changed elements.
	lanes := 8 / v.elem
	var lm []byte
	ne := nw
	if lanes > 1 {
		if lm, err = readBlocks(dec, v.lanes, (nw*lanes+7)/8); err != nil {
			return err
		}
		defer putPlanes(lm)
		ne = 0
		for _, b := range lm {
			ne += bits.OnesCount8(b)
		}
		if r := nw * lanes % 8; r != 0 && lm[len(lm)-1]>>r != 0 {
			return fmt.Errorf("%w: lane map past the changed words", ErrCorrupt)
		}
	} else if len(v.lanes) != 0 {
		return fmt.Errorf("%w: lane maps for 8-byte elements", ErrCorrupt)
	}
	es, err := readBlocks(dec, v.es, ne*v.elem)
	if err != nil {
		return err
	}
	defer putPlanes(es)
	// One pass, chunk by chunk: apply its words and hash the result's
	// chunk while it is in cache. A result that does not match is put
	// back (XOR is its own inverse).
	// Word b's lane bits lie in one byte (lanes divides 8). Its changed
	// elements are the next ones of es: one 8-byte load holds them all,
	// and each lane takes the low element when its bit is set (and shifts
	// it off), with no branch per lane; es has 8 bytes of slack for the
	// load (readBlocks).
	laneBits := uint8(1)<<lanes - 1
	width := uint(8 * v.elem)
	mask := uint64(1)<<width - 1
	esx := es[:len(es)+8]
	xor := func(c, k, j, e int) (int, int) { // chunk c, its word map k, the next changed word j and element e
		wm := maps[k*chunkMap : (k+1)*chunkMap]
		if lanes == 4 {
			return xorChunk2(base[8*c*chunkWords:8*min((c+1)*chunkWords, words)], wm, lm, esx, j, e)
		}
		for i := 0; i < chunkMap; i += 8 {
			m := binary.LittleEndian.Uint64(wm[i:])
			for m != 0 {
				w := c*chunkWords + i*8 + bits.TrailingZeros64(m)
				m &= m - 1
				var x uint64
				if lanes == 1 {
					x = binary.LittleEndian.Uint64(es[8*e:])
					e++
				} else {
					bit := j * lanes
					lb := uint64(lm[bit>>3] >> (bit & 7) & laneBits)
					y := binary.LittleEndian.Uint64(esx[v.elem*e:])
					for l := range uint(lanes) {
						nz := lb >> l & 1
						x |= (y & mask & -nz) << (width * l)
						y >>= width * uint(nz)
					}
					e += bits.OnesCount64(lb)
				}
				j++
				binary.LittleEndian.PutUint64(base[8*w:], binary.LittleEndian.Uint64(base[8*w:])^x)
			}
		}
		return j, e
	}
	undo := func() {
		for c, k, j, e := 0, 0, 0, 0; c < (words+chunkWords-1)/chunkWords; c++ {
			if v.cmap[c>>3]&(1<<(c&7)) != 0 {
				j, e = xor(c, k, j, e)
				k++
			}
		}
		for i, x := range v.tail {
			base[8*words+i] ^= x
		}
	}
	// Only the result is hashed on the way: a result that matches the
	// sender's checksum came from the base the delta was made against (a
	// wrong base gives a wrong result, but for a 2^-64 collision), so the
	// base's own hash is needed only to say which of the two failed, once
	// the base is put back. That is one pass over the tensor fewer, and
	// the streaming hash costs about a copy of its input on top of the
	// hashing (xxh3.Hasher buffers every write after its first).
	hr := xxh3.New()
	for c, k, j, e := 0, 0, 0, 0; c < (words+chunkWords-1)/chunkWords; c++ {
		p := base[8*c*chunkWords : 8*min((c+1)*chunkWords, words)]
		if v.cmap[c>>3]&(1<<(c&7)) != 0 {
			j, e = xor(c, k, j, e)
			k++
		}
		hr.Write(p)
	}
	for i, x := range v.tail {
		base[8*words+i] ^= x
	}
	hr.Write(base[8*words:])
	if hr.Sum64() == want {
		return nil
	}
	undo()
	if xxh3.Hash(base) != from {
		return ErrBaseMismatch
	}
	return fmt.Errorf("%w: the result does not match the sender's checksum", ErrCorrupt)
}
