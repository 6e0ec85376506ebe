package tcp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/tensor"
)

func FuzzReadRequest(f *testing.F) {
	for _, r := range []request{
		{op: opRead, claim: fabric.Claim{Object: fabric.ObjectID{1}, Incarnation: 7, Token: []byte("0123456789abcdef")}, offset: 5, length: 1 << 20},
		{op: opWrite, flags: flagCompress, dtype: tensor.BFloat16, length: 3},
		{op: opWrite, flags: flagEager, length: 4096},
	} {
		f.Add(r.appendTo(nil))
	}
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		var buf [maxRequest]byte
		req, err := readRequest(bytes.NewReader(in), &buf)
		if err != nil {
			if !errors.Is(err, fabric.ErrBadRequest) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		// What decodes re-encodes to the same bytes.
		if out := req.appendTo(nil); !bytes.Equal(out, in[:len(out)]) {
			t.Fatalf("re-encoded %x, read %x", out, in[:len(out)])
		}
	})
}

// bytesConn feeds recvBlocks from memory.
type bytesConn struct {
	net.Conn
	r io.Reader
}

func (c bytesConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c bytesConn) SetReadDeadline(time.Time) error  { return nil }
func (c bytesConn) SetWriteDeadline(time.Time) error { return nil }
func (c bytesConn) SetDeadline(time.Time) error      { return nil }

func FuzzRecvBlocks(f *testing.F) {
	enc := tcodec.NewEncoder()
	p := make([]byte, 300_000)
	tcodec.FillNormal(p, 2, 0.02, 1)
	var stream []byte
	for off := 0; off < len(p); off += DefaultChunkSize {
		stream, _ = enc.AppendBlock(stream, p[off:min(off+DefaultChunkSize, len(p))], tcodec.HintFor(tensor.BFloat16))
	}
	f.Add(stream, uint32(len(p)))
	raw, _ := (&tcodec.Encoder{}).AppendBlock(nil, []byte("hello, world"), tcodec.Hint{})
	f.Add(raw, uint32(12))
	f.Fuzz(func(t *testing.T, in []byte, n uint32) {
		dst := make([]byte, n%(4<<20))
		c := bytesConn{r: bytes.NewReader(in)}
		l := &link{Conn: c, r: bufio.NewReaderSize(c, 4096), stall: time.Second}
		_, err := l.recvBlocks(dst, 0, false)
		if err != nil && !errors.Is(err, fabric.ErrCorrupt) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("untyped error %v", err)
		}
		// Skipping the blocks of a refused push reads the same framing:
		// it accepts what recvBlocks accepted, and ends at the same byte.
		rest := l.r.Buffered()
		sr := bytes.NewReader(in)
		sc := bytesConn{r: sr}
		sl := &link{Conn: sc, r: bufio.NewReaderSize(sc, 4096), stall: time.Second}
		serr := sl.skipBlocks(int64(len(dst)))
		if serr != nil && !errors.Is(serr, fabric.ErrCorrupt) && !errors.Is(serr, io.EOF) && !errors.Is(serr, io.ErrUnexpectedEOF) {
			t.Fatalf("untyped error %v", serr)
		}
		if err == nil {
			if serr != nil {
				t.Fatalf("recvBlocks read what skipBlocks refused: %v", serr)
			}
			if got, want := sl.r.Buffered()+sr.Len(), rest+c.r.(*bytes.Reader).Len(); got != want {
				t.Fatalf("skipBlocks left %d bytes, recvBlocks %d", got, want)
			}
		}
	})
}
