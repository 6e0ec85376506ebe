package tcp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/tensor"
)

// The data protocol, after the peerauth handshake. A request, client to
// server:
//
//	op (1) | object (16) | incarnation (8) | token length (1) | token | offset (8) | length (8) | flags (1) | dtype (1)
//
// op is opRead (pull) or opWrite (push). flags bit 0 (flagCompress) lets
// the sender of the data compress it; dtype is the tensor.DType hint for
// the codec.
//
// Read: the server answers a status byte; on StatusOK the data follows as
// tcodec blocks (20-byte header with codec, lengths and the XXH3-64 checksum of the
// raw bytes, then the payload) until length raw bytes are delivered. On
// any other status a length-prefixed message follows.
//
// Write: the server answers a status byte as for a read (StatusOK: go
// ahead); the client then sends length raw bytes as tcodec blocks, and the
// server acknowledges with a final status once every block verified. Only
// after that ack is the sink's content complete. A corrupt block is answered
// with statusCorrupt and the connection is closed.
//
// On an encrypted connection the reader (or pusher) sets flagSealed: the
// AEAD that authenticates every record is then the integrity check of the
// request's raw blocks, which go out with a zero checksum that the
// receiver does not verify (one pass over each byte fewer on both ends);
// compressed blocks keep theirs. An owner accepts the flag only on an
// encrypted connection. An owner from before it refuses the request as bad
// (unknown flags) and hangs up; the reader then asks again on a new
// connection without it, and remembers that owner (Transport.unsealed).
//
// A small write (flagEager) sends its blocks right behind the request,
// without waiting for the go-ahead, which the server then does not send:
// one round trip instead of two. A server that refuses it answers the
// status and message and then skips the blocks, so the connection stays in
// step.
const (
	opRead  byte = 1
	opWrite byte = 2

	flagCompress byte = 1
	flagEager    byte = 2
	flagSealed   byte = 4

	// eagerMax is the largest write sent without waiting for the
	// go-ahead: a refused one costs at most this much wasted sending.
	eagerMax = DefaultChunkSize

	maxToken   = 64
	headerSize = tcodec.HeaderSize

	// statusCorrupt is the final status of a push whose data did not
	// verify. It lies outside peerauth's codes, which only this protocol
	// needs.
	statusCorrupt byte = 0x40

	// batch is how many raw chunks go out in one writev.
	batch = 4
)

type request struct {
	op             byte
	claim          fabric.Claim
	offset, length int64
	flags          byte
	dtype          tensor.DType
}

func (r request) appendTo(b []byte) []byte {
	b = append(b, r.op)
	b = append(b, r.claim.Object[:]...)
	b = binary.BigEndian.AppendUint64(b, r.claim.Incarnation)
	b = append(b, byte(len(r.claim.Token)))
	b = append(b, r.claim.Token...)
	b = binary.BigEndian.AppendUint64(b, uint64(r.offset))
	b = binary.BigEndian.AppendUint64(b, uint64(r.length))
	return append(b, r.flags, byte(r.dtype))
}

// maxRequest is the longest request.
const maxRequest = 1 + 16 + 8 + 1 + maxToken + 18

// readRequest decodes a request; buf is scratch space that the returned
// token aliases (passing a buffer that lives on keeps the reads from
// allocating).
func readRequest(r io.Reader, buf *[maxRequest]byte) (request, error) {
	head := buf[:1+16+8+1]
	if _, err := io.ReadFull(r, head); err != nil {
		return request{}, err
	}
	if head[0] != opRead && head[0] != opWrite {
		return request{}, fmt.Errorf("%w: unknown op %d", fabric.ErrBadRequest, head[0])
	}
	req := request{op: head[0]}
	copy(req.claim.Object[:], head[1:17])
	req.claim.Incarnation = binary.BigEndian.Uint64(head[17:25])
	n := int(head[25])
	if n > maxToken {
		return request{}, fmt.Errorf("%w: token of %d bytes", fabric.ErrBadRequest, n)
	}
	rest := buf[len(head) : len(head)+n+18]
	if _, err := io.ReadFull(r, rest); err != nil {
		return request{}, err
	}
	req.claim.Token = rest[:n:n]
	off, length := binary.BigEndian.Uint64(rest[n:]), binary.BigEndian.Uint64(rest[n+8:])
	if off > 1<<62 || length > 1<<62 {
		return request{}, fmt.Errorf("%w: range [%d,+%d)", fabric.ErrBadRequest, off, length)
	}
	req.offset, req.length = int64(off), int64(length)
	req.flags, req.dtype = rest[n+16], tensor.DType(rest[n+17])
	if req.flags&^(flagCompress|flagEager|flagSealed) != 0 {
		return request{}, fmt.Errorf("%w: unknown flags %#x", fabric.ErrBadRequest, req.flags)
	}
	return req, nil
}

// link is one end of a data connection with the state that makes moving
// blocks cheap: a small read buffer (block headers and the first bytes of
// a payload arrive in one read; large payloads bypass it and land straight
// in the destination), reusable writev vectors and block headers, and
// deadlines re-armed per time slice rather than per chunk.
type link struct {
	net.Conn
	r     *bufio.Reader
	stall time.Duration

	rArmed, wArmed time.Time
	strictIdle     bool // see awaitRequest
	sealed         bool // encrypted: its AEAD may stand in for block checksums

	hdrs [batch][headerSize]byte
	in   [headerSize]byte // the block header being received
	reqb [maxRequest]byte // the request being received
	vec  [2*batch + 1][]byte
	out  net.Buffers // WriteTo consumes it; kept here so it never escapes per call

	enc     *tcodec.Encoder
	dec     *tcodec.Decoder
	scratch []byte // compressed payloads on the receiving side
	req     []byte

	// encoded counts blocks run through the encoder and sampleSkips the
	// transfers a sample sent raw (for tests).
	encoded, sampleSkips int

	// sums, when set (a sealed object's read), holds the checksums of the
	// object's blocks; sumsAt is the object offset of the data being sent.
	// sendBlocks takes a raw block's checksum from it, or computes it and
	// stores it there, and counts which in sumStats (an owner's; nil on a
	// reader's connections).
	sums     *tensor.ChunkSums
	sumsAt   int64
	sumStats *sumStats

	// A gathered push's scratch (gather.go): a batch of blocks, and a
	// block to sample.
	gscratch, gbuf []byte
}

// Where a raw block's checksum came from.
const (
	sumCached   = iota // the object's cache: no read of its memory
	sumStored          // computed and stored in the cache for later sends
	sumComputed        // computed: no cache, or a block off its grid
)

// sumStats counts raw blocks sent by where their checksum came from,
// before the block goes out (so a reader that has the bytes sees them
// counted).
type sumStats struct {
	n   [3]atomic.Int64
	vec [3]prometheus.Counter // nil: not exported
}

func (s *sumStats) stats() SumStats {
	return SumStats{Cached: s.n[sumCached].Load(), Stored: s.n[sumStored].Load(), Computed: s.n[sumComputed].Load()}
}

func (s *sumStats) add(source int) {
	if s == nil {
		return
	}
	s.n[source].Add(1)
	if c := s.vec[source]; c != nil {
		c.Inc()
	}
}

// rawHeader is the header that sends p, the bytes at object offset at, as
// they are: its checksum from the link's cache when it has it.
func (l *link) rawHeader(p []byte, at int64) tcodec.Header {
	if l.sums == nil {
		l.sumStats.add(sumComputed)
		return tcodec.RawHeader(p)
	}
	if sum, ok := l.sums.Get(at, len(p)); ok {
		l.sumStats.add(sumCached)
		return tcodec.Header{Codec: tcodec.Raw, RawLen: len(p), EncLen: len(p), Sum: sum}
	}
	h := tcodec.RawHeader(p)
	if l.sums.Set(at, len(p), h.Sum) {
		l.sumStats.add(sumStored)
	} else {
		l.sumStats.add(sumComputed)
	}
	return h
}

// readBuf is the link's read buffer: a status, a block header and a 4 KiB
// payload arrive in one read, while the share of a large block's payload
// that passes through the buffer (an extra copy) stays near 3%.
const readBuf = 8 << 10

func newLink(c net.Conn, stall time.Duration) *link {
	return &link{Conn: c, r: bufio.NewReaderSize(c, readBuf), stall: stall}
}

// armRead makes sure a read deadline at least stall away is set. Setting
// it at most every stall/8 keeps timer churn off the per-chunk path; the
// deadline is stall+stall/8 ahead, so a stall is reported after between
// stall and 9/8 of it without progress.
func (l *link) armRead() {
	now := time.Now()
	if now.Sub(l.rArmed) > l.stall/8 {
		l.SetReadDeadline(now.Add(l.stall + l.stall/8))
		l.rArmed = now
	}
}

func (l *link) armWrite() {
	now := time.Now()
	if now.Sub(l.wArmed) > l.stall/8 {
		l.SetWriteDeadline(now.Add(l.stall + l.stall/8))
		l.wArmed = now
	}
}

// awaitRequest waits for the first byte of the next request, at most idle
// (then it returns errIdle). The read deadline a request armed stays armed
// after it (clearing and re-arming it per request would cost a timer each);
// when it passes while the connection waits, the wait's own idle deadline
// takes its place.
//
// strictIdle sets the idle deadline before waiting instead: a record layer
// could lose its place if the stall deadline interrupted a record half read.
func (l *link) awaitRequest(idle time.Duration) error {
	since := time.Now()
	// Keep the armed stall deadline only when it passes before the idle one.
	if l.strictIdle || l.rArmed.IsZero() || idle < l.stall+l.stall/8 {
		l.SetReadDeadline(since.Add(idle))
		l.rArmed = time.Time{}
	}
	for {
		_, err := l.r.Peek(1)
		if err == nil {
			return nil
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return err
		}
		if l.r.Buffered() == 0 && time.Since(since) >= idle {
			return errIdle
		}
		if l.strictIdle {
			return err // a record half read when the deadline hit: out of step
		}
		l.SetReadDeadline(since.Add(idle))
		l.rArmed = time.Time{}
	}
}

// errIdle ends a connection that sent no request for the server's
// IdleTimeout.
var errIdle = errors.New("tcp: connection idle for too long")

func (l *link) writev(bufs [][]byte) error {
	l.armWrite()
	l.out = bufs
	_, err := l.out.WriteTo(l.Conn)
	l.out = nil
	return err
}

// sendBlocks writes prefix (a status byte or nothing) and then data as
// tcodec blocks of at most chunk bytes. Raw blocks go out with writev
// straight from data, batch at a time, with no copy. It returns the bytes
// put on the wire. corrupt damages the first block's checksum (tests).
// unsummed leaves raw blocks' checksums out (zero): flagSealed is in force.
func (l *link) sendBlocks(prefix, data []byte, chunk int, compress bool, hint tcodec.Hint, corrupt, unsummed bool) (int64, error) {
	wire := int64(len(prefix))
	if len(data) == 0 {
		if len(prefix) == 0 {
			return 0, nil
		}
		return wire, l.writev(append(l.vec[:0], prefix))
	}
	if compress && l.enc == nil {
		l.enc = tcodec.NewEncoder()
	}
	if compress && !l.sampleShrinks(data, hint) {
		// A few small slices did not shrink: the rest will not either
		// (random or already-compressed bytes). Send raw blocks rather
		// than pay the codec on every one to learn it.
		compress = false
		l.sampleSkips++
	}
	for off := 0; off < len(data); {
		v := l.vec[:0]
		if prefix != nil {
			v = append(v, prefix)
			prefix = nil
		}
		for i := 0; i < batch && off < len(data); i++ {
			p := data[off:min(off+chunk, len(data))]
			off += len(p)
			var h tcodec.Header
			switch {
			case unsummed:
				h = tcodec.Header{Codec: tcodec.Raw, RawLen: len(p), EncLen: len(p)}
			case compress:
				// The encoder checksums the raw bytes itself.
			default:
				h = l.rawHeader(p, l.sumsAt+int64(off-len(p)))
			}
			payload := p
			if compress {
				var err error
				l.encoded++
				if h, payload, err = l.enc.Encode(p, hint); err != nil {
					return wire, err
				}
			}
			if corrupt {
				h.Sum ^= 1
				corrupt = false
			}
			h.Put(l.hdrs[i][:])
			v = append(v, l.hdrs[i][:], payload)
			wire += int64(headerSize + len(payload))
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

// Sampling: before compressing a transfer of at least sampleMin bytes, the
// sender encodes sampleSlices slices of sampleSize bytes spread over it
// (about 5% of a 1 MiB transfer, 0.3% of 16 MiB); unless one shrinks, the
// transfer goes raw.
const (
	sampleSize   = 16 << 10
	sampleSlices = 3
	sampleMin    = 4 * sampleSlices * sampleSize
)

// sampleShrinks reports whether data looks compressible from a sample; a
// transfer too small to sample is given the benefit of the doubt.
func (l *link) sampleShrinks(data []byte, hint tcodec.Hint) bool {
	if len(data) < sampleMin {
		return true
	}
	step := (len(data) - sampleSize) / (sampleSlices - 1)
	for i := range sampleSlices {
		off := i * step
		off -= off % 8 // keep elements (and planes) aligned
		p := data[off : off+sampleSize]
		h, _, err := l.enc.Encode(p, hint)
		if err == nil && h.EncLen > 0 && h.EncLen < h.RawLen {
			return true
		}
	}
	return false
}

// skipBlocks reads past the tcodec blocks of n raw bytes without decoding
// them: the data of a write that was refused after it was sent.
func (l *link) skipBlocks(n int64) error {
	for n > 0 {
		l.armRead()
		if _, err := io.ReadFull(l.r, l.in[:]); err != nil {
			return err
		}
		h, err := tcodec.ParseHeader(l.in[:])
		if err != nil {
			return asCorrupt(err)
		}
		if h.RawLen == 0 || int64(h.RawLen) > n {
			return fmt.Errorf("%w: block of %d bytes with %d left", fabric.ErrCorrupt, h.RawLen, n)
		}
		if _, err := l.r.Discard(h.EncLen); err != nil {
			return err
		}
		n -= int64(h.RawLen)
	}
	return nil
}

// recvBlocks reads tcodec blocks until dst is full, decoding them straight
// into dst and verifying every checksum (but raw blocks' when unsummed:
// flagSealed is in force). base is dst's offset in the object, for error
// messages. It returns the bytes read off the wire.
func (l *link) recvBlocks(dst []byte, base int64, unsummed bool) (int64, error) {
	return l.recvBlocksTo(dst, base, unsummed, nil)
}

// recvBlocksTo is recvBlocks that calls received(pos) after each block,
// once dst[:pos] is in place and verified (an owner copies a push into
// device memory while the rest arrives).
func (l *link) recvBlocksTo(dst []byte, base int64, unsummed bool, received func(pos int)) (int64, error) {
	hb := l.in[:]
	var wire int64
	for pos := 0; pos < len(dst); {
		l.armRead()
		if _, err := io.ReadFull(l.r, hb); err != nil {
			return wire, err
		}
		h, err := tcodec.ParseHeader(hb)
		if err != nil {
			return wire, fmt.Errorf("block at byte %d: %w", base+int64(pos), asCorrupt(err))
		}
		if h.RawLen == 0 || h.RawLen > len(dst)-pos {
			return wire, fmt.Errorf("%w: block of %d bytes with %d left", fabric.ErrCorrupt, h.RawLen, len(dst)-pos)
		}
		out := dst[pos : pos+h.RawLen]
		if h.Codec == tcodec.Raw {
			if _, err := io.ReadFull(l.r, out); err != nil {
				return wire, err
			}
			if !unsummed {
				err = h.Verify(out)
			}
		} else {
			if l.dec == nil {
				l.dec = tcodec.NewDecoder()
			}
			if cap(l.scratch) < h.EncLen {
				l.scratch = make([]byte, max(h.EncLen, DefaultChunkSize))
			}
			in := l.scratch[:h.EncLen]
			if _, err := io.ReadFull(l.r, in); err != nil {
				return wire, err
			}
			err = l.dec.Decode(out, h, in)
		}
		if err != nil {
			return wire, fmt.Errorf("block at byte %d: %w", base+int64(pos), asCorrupt(err))
		}
		wire += int64(headerSize + h.EncLen)
		pos += h.RawLen
		if received != nil {
			received(pos)
		}
	}
	return wire, nil
}

// asCorrupt makes a codec error match fabric.ErrCorrupt, as callers of a
// transport test for: tcodec sits below fabric and cannot name it.
func asCorrupt(err error) error {
	if errors.Is(err, tcodec.ErrCorrupt) && !errors.Is(err, fabric.ErrCorrupt) {
		return fmt.Errorf("%w: %w", fabric.ErrCorrupt, err)
	}
	return err
}
