package peerauth

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/tensorlane/tensorlane/fabric"
)

// MaxRecord is the most plaintext one encrypted record carries. Large
// records keep the per-record cost (a header, a tag, a syscall) small
// against the bytes of a tensor.
const MaxRecord = 128 << 10

const (
	recordHeader = 4
	tagLen       = 16
)

// Secure wraps an authenticated connection in AES-256-GCM records:
//
//	length of sealed record (4, big endian) | sealed record (plaintext + 16-byte tag)
//
// Each direction has its own key and a 64-bit record counter as nonce, so a
// nonce is never reused; the length is authenticated as additional data, so
// records cannot be truncated, reordered or replayed without the next Read
// failing with fabric.ErrCorrupt. Reads and writes may run concurrently (one
// reader and one writer at a time, as for any net.Conn).
func Secure(c net.Conn, k Keys) (net.Conn, error) {
	if len(k.Send) != 32 || len(k.Recv) != 32 {
		return nil, errShortKey
	}
	mk := func(key []byte) (cipher.AEAD, error) {
		b, err := aes.NewCipher(key)
		if err != nil {
			return nil, err
		}
		return cipher.NewGCM(b)
	}
	send, err := mk(k.Send)
	if err != nil {
		return nil, err
	}
	recv, err := mk(k.Recv)
	if err != nil {
		return nil, err
	}
	return &secureConn{Conn: c, send: send, recv: recv}, nil
}

// Wrap returns c encrypted with the handshake's keys, or c itself when the
// handshake did not set up encryption.
func (r Result) Wrap(c net.Conn) (net.Conn, error) {
	if r.Keys == nil {
		return c, nil
	}
	return Secure(c, *r.Keys)
}

type secureConn struct {
	net.Conn

	wmu   sync.Mutex
	send  cipher.AEAD
	wseq  uint64
	wbuf  []byte
	rmu   sync.Mutex
	recv  cipher.AEAD
	rseq  uint64
	rbuf  []byte // sealed record being read
	plain []byte // decrypted bytes not yet returned
	rerr  error  // sticky: a failed record breaks the stream
}

func nonce(seq uint64) []byte {
	var n [12]byte
	binary.BigEndian.PutUint64(n[4:], seq)
	return n[:]
}

func (c *secureConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	written := 0
	for len(p) > 0 {
		n := min(len(p), MaxRecord)
		need := recordHeader + n + tagLen
		if cap(c.wbuf) < need {
			c.wbuf = make([]byte, need, recordHeader+MaxRecord+tagLen)
		}
		buf := c.wbuf[:recordHeader]
		binary.BigEndian.PutUint32(buf, uint32(n+tagLen))
		buf = c.send.Seal(buf, nonce(c.wseq), p[:n], buf[:recordHeader])
		c.wseq++
		if _, err := c.Conn.Write(buf); err != nil {
			return written, err
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

func (c *secureConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if len(c.plain) > 0 {
		n := copy(p, c.plain)
		c.plain = c.plain[n:]
		return n, nil
	}
	if c.rerr != nil {
		return 0, c.rerr
	}
	if len(p) == 0 {
		return 0, nil
	}
	var hdr [recordHeader]byte
	if _, err := io.ReadFull(c.Conn, hdr[:]); err != nil {
		return 0, err // io.EOF at a record boundary is a clean end
	}
	size := int(binary.BigEndian.Uint32(hdr[:]))
	if size < tagLen || size > MaxRecord+tagLen {
		c.rerr = fmt.Errorf("%w: encrypted record of %d bytes", fabric.ErrCorrupt, size)
		return 0, c.rerr
	}
	if cap(c.rbuf) < size {
		c.rbuf = make([]byte, size, MaxRecord+tagLen)
	}
	sealed := c.rbuf[:size]
	if _, err := io.ReadFull(c.Conn, sealed); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, err
	}
	// Open straight into the caller's buffer when it has room: one copy
	// fewer on the bulk path.
	var dst []byte
	direct := len(p) >= size-tagLen
	if direct {
		dst = p[:0]
	} else {
		dst = sealed[:0]
	}
	out, err := c.recv.Open(dst, nonce(c.rseq), sealed, hdr[:])
	if err != nil {
		c.rerr = fmt.Errorf("%w: encrypted record %d failed authentication", fabric.ErrCorrupt, c.rseq)
		return 0, c.rerr
	}
	c.rseq++
	if direct {
		return len(out), nil
	}
	n := copy(p, out)
	c.plain = out[n:]
	return n, nil
}
