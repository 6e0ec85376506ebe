package softrdma

import (
	"bufio"
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/provbase"
)

// maxHandlers bounds the messages of one queue pair handled at once.
const maxHandlers = 64

// directWrite is the payload size from which frames bypass the write
// buffer.
const directWrite = 16 << 10

// responder is the passive side of one accepted queue pair.
type responder struct {
	dev  *device
	conn net.Conn
	id   rdma.RemoteQP

	wmu    sync.Mutex // one frame at a time
	w      *bufio.Writer
	writes map[uint64]rdma.Status // WRITE requests in progress: first failure
	// abort drops the queue pair: Deregister calls it when a region it
	// revokes is held by a transfer that does not finish.
	abort   func()
	badKeys int // accesses with keys never issued to this peer
}

// maxBadKeys is how many remote accesses with keys never issued to its
// peer (or with an issued key outside its region or rights) a queue pair
// may make before it is dropped: a correct requester makes none, and a
// handful (8) leaves room for a buggy reader to be told why; a guesser must pay a new
// connection and handshake per maxBadKeys tries.
const maxBadKeys = 8

// serve runs one accepted queue pair; the accept loop closes the
// connection afterwards.
func (d *device) serve(c net.Conn) {
	from, ok := d.Accept(c, nil)
	if !ok {
		return
	}
	r := &responder{dev: d, conn: c, id: from, writes: map[uint64]rdma.Status{}}
	r.abort = func() { r.conn.Close() }
	r.serve()
}

func (r *responder) serve() {
	d := r.dev
	who := r.id.Peer
	r.w = bufio.NewWriterSize(r.conn, 32<<10)
	s := d.Session(r.conn, r.id, maxHandlers)
	defer s.End()

	br := bufio.NewReaderSize(r.conn, 32<<10)
	buf := make([]byte, MaxPayload)
	var h [headerLen]byte
	for {
		s.ArmIdle()
		f, err := readHeader(br, &h)
		if err == nil && f.op != opWriteReq {
			err = readPayload(br, &h, f, buf[:f.payloadLen])
		}
		if err != nil {
			s.Ended(err)
			return
		}
		switch f.op {
		case opReadReq:
			err = r.serveRead(f)
		case opWriteReq:
			err = r.serveWrite(br, &h, f, buf)
		case opCall:
			msg := append([]byte(nil), buf[:f.payloadLen]...)
			if !s.Go(func(ctx context.Context) { r.answer(ctx, f.id, msg) }) {
				return
			}
		default:
			d.Log.Warn("rdma queue pair sent an unexpected op", "peer", who, "op", f.op)
			return
		}
		if errors.Is(err, errBadKeys) {
			d.Log.Warn("rdma queue pair dropped: too many bad memory keys", "peer", who, "bad_keys", r.badKeys)
			d.Dropped("bad_keys", who)
			return
		}
		if err != nil {
			d.Log.Debug("rdma queue pair failed", "peer", who, "err", err)
			return
		}
	}
}

var errBadKeys = errors.New("softrdma: too many bad memory keys")

// badKey counts one access with a key that was never the peer's to use;
// past maxBadKeys it returns errBadKeys, which drops the queue pair.
func (r *responder) badKey() error {
	r.badKeys++
	if m := r.dev.Cfg.ListenerMetrics; m != nil {
		m.BadKeys.WithLabelValues(r.dev.Label).Inc()
	}
	if r.badKeys >= maxBadKeys {
		return errBadKeys
	}
	return nil
}

// send writes one frame and flushes it.
func (r *responder) send(f frame, payload []byte, corrupt bool) error {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.conn.SetWriteDeadline(time.Now().Add(r.dev.p.cfg.StallTimeout))
	if len(payload) >= directWrite {
		// One writev straight from the chunk: no copy into the buffer.
		if err := r.w.Flush(); err != nil {
			return err
		}
		return writeFrame(r.conn, f, payload, corrupt)
	}
	if err := writeFrame(r.w, f, payload, corrupt); err != nil {
		return err
	}
	return r.w.Flush()
}

// serveRead streams the requested bytes in checksummed chunks, each
// checksummed and written straight from the region (no staging copy)
// while the region is held, so a deregistration stops the stream with a
// remote access error and never exposes later bytes.
func (r *responder) serveRead(f frame) error {
	m, ok, guess := r.dev.remoteMR(f.rkey, rdma.AccessRemoteRead, r.id.Peer)
	if ok {
		_, ok = m.span(f.addr, uint64(f.length))
		guess = !ok
	}
	if !ok {
		if guess {
			if err := r.badKey(); err != nil {
				return err
			}
		}
		return r.send(frame{op: opReadResp, id: f.id, status: uint8(rdma.StatusRemoteAccess), flags: flagLast}, nil, false)
	}
	chunkSize := uint32(r.dev.p.cfg.ChunkSize)
	for off := uint32(0); off < f.length || f.length == 0; {
		c := min(f.length-off, chunkSize)
		out := frame{op: opReadResp, id: f.id, addr: uint64(off)}
		if off+c == f.length {
			out.flags = flagLast
		}
		corrupt := c > 0 && r.dev.p.cfg.Faults.TakeCorrupt() // a flipped bit after the checksum
		ok, err := m.io(f.addr+uint64(off), int(c), &r.abort, func(chunk []byte) error {
			return r.send(out, chunk, corrupt)
		})
		if err != nil {
			return err
		}
		if !ok {
			return r.send(frame{op: opReadResp, id: f.id, status: uint8(rdma.StatusRemoteAccess), flags: flagLast}, nil, false)
		}
		if f.length == 0 {
			break
		}
		off += c
	}
	return nil
}

// serveWrite receives one chunk of a WRITE straight into the region (the
// NIC's DMA; the header was checked, the payload's checksum is checked
// once it is in: a mismatch drops the queue pair, which fails the
// request); the status goes back after the last chunk. A chunk with a bad
// key or range poisons the whole request and is read and dropped.
func (r *responder) serveWrite(br *bufio.Reader, h *[headerLen]byte, f frame, buf []byte) error {
	st := r.writes[f.id]
	landed := false
	if st == rdma.StatusSuccess {
		m, ok, guess := r.dev.remoteMR(f.rkey, rdma.AccessRemoteWrite, r.id.Peer)
		if ok {
			_, ok = m.span(f.addr, uint64(f.payloadLen))
			guess = !ok
		}
		if guess {
			// Once per request: its other chunks carry the same key.
			if err := r.badKey(); err != nil {
				return err
			}
		}
		if ok {
			var err error
			ok, err = m.io(f.addr, int(f.payloadLen), &r.abort, func(dst []byte) error {
				return readPayload(br, h, f, dst)
			})
			if err != nil {
				return err
			}
		}
		if !ok {
			st = rdma.StatusRemoteAccess
		}
		landed = ok
	}
	if !landed {
		if err := readPayload(br, h, f, buf[:f.payloadLen]); err != nil {
			return err
		}
	}
	if f.flags&flagLast == 0 {
		if _, known := r.writes[f.id]; !known && len(r.writes) >= 4096 {
			return errors.New("softrdma: too many WRITE requests in progress")
		}
		r.writes[f.id] = st
		return nil
	}
	delete(r.writes, f.id)
	return r.send(frame{op: opWriteResp, id: f.id, status: uint8(st), flags: flagLast}, nil, false)
}

// answer runs the handler for one message and sends its answer; an error
// travels as a peerauth status code and message.
func (r *responder) answer(ctx context.Context, id uint64, msg []byte) {
	resp, err := r.dev.Handle(ctx, r.id, msg)
	out := frame{op: opCallResp, id: id, flags: flagLast}
	if err != nil {
		out.status = 1
		resp = provbase.ErrorAnswer(err)
	}
	if len(resp) > MaxMessage {
		out.status = 1
		resp = append([]byte{peerauth.StatusInternal}, "answer too long"...)
	}
	if err := r.send(out, resp, false); err != nil {
		r.conn.Close()
	}
}
