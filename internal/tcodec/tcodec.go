package tcodec

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/klauspost/compress/huff0"
	"github.com/klauspost/compress/s2"
	"github.com/zeebo/xxh3"

	"github.com/tensorlane/tensorlane/tensor"
)

// Codec names how a block's payload is encoded.
type Codec uint8

const (
	Raw    Codec = iota // payload is the raw bytes
	Planes              // byte planes, each huff0-coded, run-length or raw
	S2                  // klauspost/compress/s2
	numCodecs
)

func (c Codec) String() string {
	switch c {
	case Raw:
		return "raw"
	case Planes:
		return "planes"
	case S2:
		return "s2"
	}
	return fmt.Sprintf("codec(%d)", uint8(c))
}

const (
	// HeaderSize is the size of a block header.
	HeaderSize = 20
	// MaxBlock is the largest raw block. Decoders refuse larger ones, which
	// bounds what a hostile header can make them allocate.
	MaxBlock = 1 << 20
	// segment is the most bytes of one plane coded together; it stays under
	// huff0's block limit (256 KiB - 1) and in L2 cache.
	segment = 128 << 10
	version = 2
)

// Segment modes inside a Planes payload.
const (
	segRaw  = 0
	segHuff = 1
	segRLE  = 2
	segHead = 5 // mode (1) | encoded length (4)
)

// Checksum is the XXH3-64 every block header carries for its raw bytes.
// XXH3 rather than a CRC because it is the cheapest strong check there is:
// about 60 GB/s a core with AVX2/AVX-512 here against 15-30 GB/s for
// CRC-32 with carry-less multiplication, and on a CPU-bound link both ends
// pay for it on every byte. A random corruption goes unnoticed with
// probability 2^-64.
func Checksum(p []byte) uint64 { return xxh3.Hash(p) }

// Header describes one block:
//
//	codec (1) | element size (1) | version (1) | reserved (1) | raw length (4) | encoded length (4) | xxh3-64 of raw (8)
//
// all big-endian. The encoded payload of EncLen bytes follows it.
type Header struct {
	Codec  Codec
	Elem   uint8 // element size in bytes for Planes, else 0
	RawLen int
	EncLen int
	Sum    uint64 // Checksum of the raw bytes
}

// Put writes h into b, which must hold HeaderSize bytes.
func (h Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	b[0], b[1], b[2], b[3] = byte(h.Codec), h.Elem, version, 0
	binary.BigEndian.PutUint32(b[4:], uint32(h.RawLen))
	binary.BigEndian.PutUint32(b[8:], uint32(h.EncLen))
	binary.BigEndian.PutUint64(b[12:], h.Sum)
}

// ErrCorrupt matches every decoding failure. The codec sits below fabric
// and cannot name fabric.ErrCorrupt; its caller (fabric/tcp) wraps it so
// that transfer errors match that.
var ErrCorrupt = errors.New("tcodec: data corrupt")

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
}

// ParseHeader reads and validates a header: known codec and version, raw
// length at most MaxBlock, and an encoded length that the codec can
// produce (never more than the raw length: encoders send raw instead).
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, corrupt("header of %d bytes", len(b))
	}
	h := Header{
		Codec:  Codec(b[0]),
		Elem:   b[1],
		RawLen: int(binary.BigEndian.Uint32(b[4:])),
		EncLen: int(binary.BigEndian.Uint32(b[8:])),
		Sum:    binary.BigEndian.Uint64(b[12:]),
	}
	switch {
	case b[2] != version || b[3] != 0:
		return Header{}, corrupt("block version %d.%d", b[2], b[3])
	case h.Codec >= numCodecs:
		return Header{}, corrupt("unknown codec %d", b[0])
	case h.RawLen > MaxBlock:
		return Header{}, corrupt("block of %d bytes (max %d)", h.RawLen, MaxBlock)
	case h.EncLen > h.RawLen:
		return Header{}, corrupt("%v block encodes %d bytes in %d", h.Codec, h.RawLen, h.EncLen)
	case h.Codec == Raw && h.EncLen != h.RawLen:
		return Header{}, corrupt("raw block of %d bytes carries %d", h.RawLen, h.EncLen)
	case h.Codec == Planes && !validElem(h.Elem):
		return Header{}, corrupt("planes block with element size %d", h.Elem)
	case h.Codec != Planes && h.Elem != 0:
		return Header{}, corrupt("%v block with element size %d", h.Codec, h.Elem)
	}
	return h, nil
}

func validElem(e uint8) bool { return e == 1 || e == 2 || e == 4 || e == 8 }

// Verify checks raw against the header's checksum.
func (h Header) Verify(raw []byte) error {
	if len(raw) != h.RawLen {
		return corrupt("block decoded to %d bytes, header says %d", len(raw), h.RawLen)
	}
	if Checksum(raw) != h.Sum {
		return corrupt("checksum mismatch in a %v block of %d bytes", h.Codec, h.RawLen)
	}
	return nil
}

// RawHeader is the header that sends p as it is.
func RawHeader(p []byte) Header {
	return Header{Codec: Raw, RawLen: len(p), EncLen: len(p), Sum: Checksum(p)}
}

// Hint tells the encoder what the bytes are.
type Hint struct {
	Elem  int  // element size in bytes; 0 when unknown
	Float bool // floating-point elements: use byte planes
}

// HintFor returns the hint for tensors of dt (the zero Hint for Invalid).
func HintFor(dt tensor.DType) Hint {
	return Hint{Elem: int(dt.Size()), Float: dt.IsFloat()}
}

// CodecFor returns the codec the encoder tries for h.
func CodecFor(h Hint) Codec {
	if h.Float && validElem(uint8(h.Elem)) {
		return Planes
	}
	return S2
}

// Encoder encodes blocks. It keeps scratch buffers between calls and is
// not safe for concurrent use; use one per goroutine.
type Encoder struct {
	huff  huff0.Scratch
	out   []byte
	plane []byte
	// skip[p] > 0: plane p did not shrink recently, so it is sent raw for
	// that many more segments without trying (mantissa planes are close to
	// random; trying costs a histogram pass each time).
	skip [8]int
	elem int
}

// NewEncoder returns an encoder.
func NewEncoder() *Encoder { return &Encoder{} }

// minGain: a block or plane is coded only when it shrinks by at least
// 1/64; smaller gains cost more decode time than they save on the wire.
func worthIt(enc, raw int) bool { return enc < raw-raw>>6 }

// Encode encodes src (at most MaxBlock bytes) as one block. The payload is
// src itself when the block goes raw, else the encoder's buffer, valid
// until the next call.
func (e *Encoder) Encode(src []byte, hint Hint) (Header, []byte, error) {
	if len(src) > MaxBlock {
		return Header{}, nil, fmt.Errorf("tcodec: block of %d bytes (max %d)", len(src), MaxBlock)
	}
	h := RawHeader(src)
	if len(src) < 64 {
		return h, src, nil
	}
	var payload []byte
	switch CodecFor(hint) {
	case Planes:
		payload = e.planes(src, hint.Elem)
		h.Codec, h.Elem = Planes, uint8(hint.Elem)
	default:
		if need := s2.MaxEncodedLen(len(src)); cap(e.out) < need {
			e.out = make([]byte, need)
		}
		payload = s2.Encode(e.out[:cap(e.out)], src)
		h.Codec = S2
	}
	if !worthIt(len(payload), len(src)) {
		return RawHeader(src), src, nil
	}
	h.EncLen = len(payload)
	return h, payload, nil
}

// AppendBlock appends src encoded as one block, header first, to dst.
func (e *Encoder) AppendBlock(dst, src []byte, hint Hint) ([]byte, error) {
	h, payload, err := e.Encode(src, hint)
	if err != nil {
		return dst, err
	}
	var hb [HeaderSize]byte
	h.Put(hb[:])
	dst = append(dst, hb[:]...)
	return append(dst, payload...), nil
}

func (e *Encoder) planes(src []byte, elem int) []byte {
	if e.elem != elem {
		e.elem, e.skip = elem, [8]int{}
	}
	n := len(src) / elem
	if cap(e.out) < len(src) {
		e.out = make([]byte, 0, len(src)+1024)
	}
	if cap(e.plane) < elem*segment {
		e.plane = make([]byte, elem*segment)
	}
	out := e.out[:0]
	e.huff.Reuse = huff0.ReusePolicyNone // segments decode independently
	for e0 := 0; e0 < n; e0 += segment {
		e1 := min(e0+segment, n)
		k := e1 - e0
		split(e.plane[:elem*k], src[e0*elem:e1*elem], elem, k)
		for p := range elem {
			in := e.plane[p*k : (p+1)*k]
			out = e.segment(out, in, p)
			if len(out) >= len(src) {
				return out // no gain: Encode sends raw
			}
		}
	}
	return append(out, src[n*elem:]...)
}

func (e *Encoder) segment(out, in []byte, p int) []byte {
	if e.skip[p] > 0 {
		e.skip[p]--
		return appendSeg(out, segRaw, in)
	}
	comp, _, err := huff0.Compress4X(in, &e.huff)
	switch {
	case errors.Is(err, huff0.ErrUseRLE):
		return appendSeg(out, segRLE, in[:1])
	case err == nil && worthIt(len(comp), len(in)):
		return appendSeg(out, segHuff, comp)
	}
	e.skip[p] = 7
	return appendSeg(out, segRaw, in)
}

func appendSeg(out []byte, mode byte, data []byte) []byte {
	out = append(out, mode)
	out = binary.BigEndian.AppendUint32(out, uint32(len(data)))
	return append(out, data...)
}

// Decoder decodes blocks. It keeps scratch buffers (at most about
// 2*MaxBlock bytes) and is not safe for concurrent use.
type Decoder struct {
	huff  *huff0.Scratch
	plane []byte
}

// NewDecoder returns a decoder.
func NewDecoder() *Decoder { return &Decoder{huff: &huff0.Scratch{}} }

// Decode decodes payload, described by h (from ParseHeader), into dst,
// which must be h.RawLen bytes, and verifies the checksum. On error dst's
// contents are undefined.
func (d *Decoder) Decode(dst []byte, h Header, payload []byte) error {
	if len(dst) != h.RawLen || len(payload) != h.EncLen {
		return corrupt("block of %d/%d bytes into %d/%d", h.RawLen, h.EncLen, len(dst), len(payload))
	}
	switch h.Codec {
	case Raw:
		copy(dst, payload)
	case Planes:
		if err := d.planes(dst, int(h.Elem), payload); err != nil {
			return err
		}
	case S2:
		n, err := s2.DecodedLen(payload)
		if err != nil || n != len(dst) {
			return corrupt("s2 block decodes to %d bytes, want %d (%v)", n, len(dst), err)
		}
		out, err := s2.Decode(dst, payload)
		if err != nil {
			return corrupt("s2: %v", err)
		}
		if len(out) > 0 && &out[0] != &dst[0] {
			copy(dst, out)
		}
	default:
		return corrupt("unknown codec %d", h.Codec)
	}
	return h.Verify(dst)
}

// DecodeBlock decodes the block at the front of in, appends its raw bytes
// to dst and returns the rest of in.
func (d *Decoder) DecodeBlock(dst, in []byte) (out, rest []byte, err error) {
	h, err := ParseHeader(in)
	if err != nil {
		return dst, in, err
	}
	in = in[HeaderSize:]
	if len(in) < h.EncLen {
		return dst, in, corrupt("block payload truncated: %d of %d bytes", len(in), h.EncLen)
	}
	start := len(dst)
	dst = append(dst, make([]byte, h.RawLen)...)
	if err := d.Decode(dst[start:], h, in[:h.EncLen]); err != nil {
		return dst[:start], in, err
	}
	return dst, in[h.EncLen:], nil
}

func (d *Decoder) planes(dst []byte, elem int, in []byte) error {
	n := len(dst) / elem
	if cap(d.plane) < elem*segment {
		d.plane = make([]byte, elem*segment)
	}
	for e0 := 0; e0 < n; e0 += segment {
		e1 := min(e0+segment, n)
		k := e1 - e0
		for p := range elem {
			var err error
			if in, err = d.segment(d.plane[p*k:(p+1)*k], in); err != nil {
				return err
			}
		}
		join(dst[e0*elem:e1*elem], d.plane[:elem*k], elem, k)
	}
	if len(in) != len(dst)-n*elem {
		return corrupt("planes block ends with %d bytes, want %d", len(in), len(dst)-n*elem)
	}
	copy(dst[n*elem:], in)
	return nil
}

// segment decodes one plane segment of exactly len(out) bytes from the
// front of in.
func (d *Decoder) segment(out, in []byte) ([]byte, error) {
	if len(in) < segHead {
		return nil, corrupt("truncated segment header")
	}
	mode, l := in[0], int(binary.BigEndian.Uint32(in[1:]))
	in = in[segHead:]
	if l > len(in) {
		return nil, corrupt("segment of %d bytes with %d left", l, len(in))
	}
	data, rest := in[:l], in[l:]
	switch mode {
	case segRaw:
		if l != len(out) {
			return nil, corrupt("raw segment of %d bytes, want %d", l, len(out))
		}
		copy(out, data)
	case segRLE:
		if l != 1 {
			return nil, corrupt("run-length segment of %d bytes", l)
		}
		for i := range out {
			out[i] = data[0]
		}
	case segHuff:
		s, remain, err := huff0.ReadTable(data, d.huff)
		if err != nil {
			return nil, corrupt("huff0 table: %v", err)
		}
		d.huff = s
		// Decode straight into the plane: the capacity bounds the output.
		got, err := s.Decoder().Decompress4X(out[:0:len(out)], remain)
		if err != nil {
			return nil, corrupt("huff0: %v", err)
		}
		if len(got) != len(out) {
			return nil, corrupt("huff0 segment decoded to %d bytes, want %d", len(got), len(out))
		}
	default:
		return nil, corrupt("unknown segment mode %d", mode)
	}
	return rest, nil
}
