package softrdma

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/provbase"
)

// qp is the active side of a queue pair: it posts work requests and
// receives their responses. Two goroutines run while it is connected: a
// sender (posting never blocks on the socket) and a receiver.
type qp struct {
	// Fault holds why and with what status the queue pair broke; it
	// breaks under mu, with the flush of pending and calls.
	provbase.Fault
	pd  *pd
	cq  *cq
	cfg rdma.QPConfig

	mu      sync.Mutex
	conn    net.Conn
	pending map[uint64]*pendingWR // by wire id
	calls   provbase.Calls[callResult]
	seq     uint64
	// receiving is the READ whose chunk the receiver is reading into its
	// region: when the queue pair breaks meanwhile, its flush completion
	// waits until the receiver is out of the region (late), so nothing
	// writes a work request's memory after its completion.
	receiving *pendingWR
	sendq     chan outbound
	done      chan struct{}
	wg        sync.WaitGroup
	// abort breaks the queue pair: Deregister calls it when a local
	// region it revokes is held by a transfer that does not finish.
	abort func()
	// vec is the sender's iovec for a frame of a gathered WRITE.
	vec net.Buffers
}

type pendingWR struct {
	seq   uint64 // wire id
	wr    rdma.WorkRequest
	op    rdma.Opcode
	local *mr
	got   uint32 // READ: bytes received so far
	fail  rdma.Status
	late  bool // flushed while receiving: the receiver completes it
}

type outbound struct {
	op   byte
	id   uint64
	wr   rdma.WorkRequest
	mr   *mr
	segs []localSeg // a WRITE of an SGL: its non-empty segments
	body []byte     // opCall
}

// localSeg is a segment of a WRITE's SGL, its region looked up.
type localSeg struct {
	mr   *mr
	addr uint64
	n    uint32
}

type callResult struct {
	msg []byte
	err error
}

var (
	errQPClosed = fmt.Errorf("softrdma: queue pair closed: %w", fabric.ErrClosed)
	errAborted  = fmt.Errorf("%w: softrdma: queue pair broken: a local region was deregistered under a transfer that did not finish within %v",
		fabric.ErrPeerClosed, ioGrace)
)

// Connect dials the remote NIC from this device's address and runs the
// peerauth handshake.
func (q *qp) Connect(ctx context.Context, addr string, want peer.ID) error {
	d := q.pd.dev
	q.mu.Lock()
	if q.conn != nil || q.Err() != nil {
		q.mu.Unlock()
		return errors.New("softrdma: queue pair already connected or closed")
	}
	q.mu.Unlock()
	dial := d.nic.Dial
	if dial == nil {
		dial = DialFrom
	}
	conn, err := d.Dial(ctx, addr, want, dial, nil)
	if err != nil {
		return err
	}
	d.Mu.Lock()
	if d.Closed {
		d.Mu.Unlock()
		conn.Close()
		return fabric.ErrClosed
	}
	d.qps[q] = struct{}{}
	d.Mu.Unlock()
	q.mu.Lock()
	if err := q.Err(); err != nil { // closed while connecting
		q.mu.Unlock()
		conn.Close()
		return err
	}
	q.conn = conn
	q.sendq = make(chan outbound, q.cfg.MaxOutstanding+64)
	q.done = make(chan struct{})
	q.wg.Add(2)
	q.mu.Unlock()
	go q.send()
	go q.receive()
	return nil
}

func (q *qp) PostRead(wr rdma.WorkRequest) error  { return q.post(opReadReq, rdma.OpRead, wr) }
func (q *qp) PostWrite(wr rdma.WorkRequest) error { return q.post(opWriteReq, rdma.OpWrite, wr) }

func (q *qp) post(op byte, opc rdma.Opcode, wr rdma.WorkRequest) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.Ready(q.conn != nil); err != nil {
		return err
	}
	if err := rdma.CheckSGL(wr, opc, q.pd.dev.p.cfg.MaxSGE); err != nil {
		return err
	}
	if len(q.pending) >= q.cfg.MaxOutstanding {
		return rdma.ErrQueueFull
	}
	if len(wr.SGL) > 0 {
		return q.postSGLLocked(op, opc, wr)
	}
	local := q.pd.dev.localMR(q.pd, wr.LKey)
	need := rdma.Access(0)
	if opc == rdma.OpRead {
		need = rdma.AccessLocalWrite
	}
	if local == nil || local.access&need != need {
		q.cq.Push(rdma.Completion{ID: wr.ID, Op: opc, Status: rdma.StatusLocalProtection,
			Err: fmt.Errorf("softrdma: local key %#x unknown or without access", wr.LKey)})
		return nil
	}
	if _, ok := local.span(wr.LocalAddr, uint64(wr.Length)); !ok {
		q.cq.Push(rdma.Completion{ID: wr.ID, Op: opc, Status: rdma.StatusLocalProtection,
			Err: fmt.Errorf("softrdma: local range [%#x,+%d) outside the region", wr.LocalAddr, wr.Length)})
		return nil
	}
	q.seq++
	id := q.seq
	q.pending[id] = &pendingWR{seq: id, wr: wr, op: opc, local: local}
	q.armLocked()
	q.sendq <- outbound{op: op, id: id, wr: wr, mr: local} // room: bounded by MaxOutstanding
	return nil
}

// postSGLLocked posts a WRITE of several local segments: each must lie in
// a region of this protection domain, as a single segment must.
func (q *qp) postSGLLocked(op byte, opc rdma.Opcode, wr rdma.WorkRequest) error {
	segs := make([]localSeg, 0, len(wr.SGL))
	for i, sg := range wr.SGL {
		m := q.pd.dev.localMR(q.pd, sg.LKey)
		if m == nil {
			q.cq.Push(rdma.Completion{ID: wr.ID, Op: opc, Status: rdma.StatusLocalProtection,
				Err: fmt.Errorf("softrdma: segment %d: local key %#x unknown", i, sg.LKey)})
			return nil
		}
		if _, ok := m.span(sg.Addr, uint64(sg.Length)); !ok {
			q.cq.Push(rdma.Completion{ID: wr.ID, Op: opc, Status: rdma.StatusLocalProtection,
				Err: fmt.Errorf("softrdma: segment %d: local range [%#x,+%d) outside the region", i, sg.Addr, sg.Length)})
			return nil
		}
		if sg.Length > 0 {
			segs = append(segs, localSeg{mr: m, addr: sg.Addr, n: sg.Length})
		}
	}
	q.seq++
	id := q.seq
	local := q.pd.dev.localMR(q.pd, wr.SGL[0].LKey)
	q.pending[id] = &pendingWR{seq: id, wr: wr, op: opc, local: local}
	q.armLocked()
	o := outbound{op: op, id: id, wr: wr, mr: local, segs: segs}
	if len(segs) == 0 {
		// A WRITE of no bytes: sendWrite's one empty last frame.
		o.segs, o.wr.LocalAddr = nil, wr.SGL[0].Addr
	}
	q.sendq <- o // room: bounded by MaxOutstanding
	return nil
}

// armLocked sets the receive deadline: while anything is outstanding the
// remote must make progress within Timeout, else the queue pair breaks
// (RC "retry exceeded"); an idle queue pair waits without a deadline.
func (q *qp) armLocked() {
	if len(q.pending) > 0 || q.calls.Len() > 0 {
		q.conn.SetReadDeadline(time.Now().Add(q.cfg.Timeout))
	} else {
		q.conn.SetReadDeadline(time.Time{})
	}
}

// Call sends a message to the remote's handler and waits for the answer.
func (q *qp) Call(ctx context.Context, msg []byte) ([]byte, error) {
	r, err := q.calls.Round(ctx, &q.Fault, len(msg), MaxMessage, func(id uint64) error {
		q.mu.Lock()
		defer q.mu.Unlock()
		if err := q.Ready(q.conn != nil); err != nil {
			return err
		}
		q.armLocked() // the remote must answer within Timeout
		select {
		case q.sendq <- outbound{op: opCall, id: id, body: msg}:
			return nil
		default:
			return rdma.ErrQueueFull
		}
	})
	if err != nil {
		// The call is gone: the deadline may have been its alone.
		q.mu.Lock()
		if q.conn != nil && q.Err() == nil {
			q.armLocked()
		}
		q.mu.Unlock()
		return nil, err
	}
	return r.msg, r.err
}

// Close flushes outstanding work and disconnects. Idempotent.
func (q *qp) Close() error {
	q.fail(errQPClosed, rdma.StatusFlushed)
	q.wg.Wait()
	d := q.pd.dev
	d.Mu.Lock()
	delete(d.qps, q)
	d.Mu.Unlock()
	return nil
}

// fail breaks the queue pair once: every outstanding work request
// completes with status, every call returns err.
func (q *qp) fail(err error, status rdma.Status) {
	var pending map[uint64]*pendingWR
	var calls []chan callResult
	if !q.BreakUnder(&q.mu, err, status, func() {
		pending, calls = q.pending, q.calls.Flush()
		q.pending = map[uint64]*pendingWR{}
		if q.conn != nil {
			q.conn.Close()
			close(q.done)
		}
		if p := q.receiving; p != nil && pending[p.seq] == p {
			p.late = true
			delete(pending, p.seq)
		}
	}) {
		return
	}
	for _, p := range pending {
		q.cq.Push(rdma.Completion{ID: p.wr.ID, Op: p.op, Status: status, Err: err})
	}
	for _, ch := range calls {
		ch <- callResult{err: err}
	}
}

func (q *qp) send() {
	defer q.wg.Done()
	w := bufio.NewWriterSize(q.conn, 32<<10)
	for {
		var o outbound
		select {
		case o = <-q.sendq:
		case <-q.done:
			return
		}
		var err error
		q.conn.SetWriteDeadline(time.Now().Add(q.cfg.Timeout))
		switch o.op {
		case opReadReq:
			err = writeFrame(w, frame{op: opReadReq, id: o.id, rkey: o.wr.RKey, addr: o.wr.RemoteAddr, length: o.wr.Length}, nil, false)
		case opCall:
			err = writeFrame(w, frame{op: opCall, id: o.id}, o.body, false)
		case opWriteReq:
			err = q.sendWrite(w, o)
		}
		if err == nil && len(q.sendq) == 0 {
			err = w.Flush()
		}
		if err != nil {
			q.fail(fmt.Errorf("%w: softrdma: send: %v", fabric.ErrPeerClosed, err), rdma.StatusRetryExceeded)
			return
		}
	}
}

// sendWrite sends a WRITE as checksummed chunks written straight from the
// local region (which may be deregistered meanwhile: then the WRITE fails
// locally and the remote is told to drop what it got).
func (q *qp) sendWrite(w *bufio.Writer, o outbound) error {
	if o.segs != nil {
		return q.sendGathered(w, o)
	}
	n := o.wr.Length
	chunkSize := uint32(q.pd.dev.p.cfg.ChunkSize)
	for off := uint32(0); off < n || n == 0; {
		c := min(n-off, chunkSize)
		f := frame{op: opWriteReq, id: o.id, rkey: o.wr.RKey, addr: o.wr.RemoteAddr + uint64(off), length: n}
		if off+c == n {
			f.flags = flagLast
		}
		ok, err := o.mr.io(o.wr.LocalAddr+uint64(off), int(c), &q.abort, func(chunk []byte) error {
			if len(chunk) >= directWrite {
				// One writev straight from the region: no copy.
				if err := w.Flush(); err != nil {
					return err
				}
				return writeFrame(q.conn, f, chunk, false)
			}
			return writeFrame(w, f, chunk, false)
		})
		if err != nil {
			return err
		}
		if !ok {
			return q.abortWrite(w, o.id, n)
		}
		off += c
		if n == 0 {
			break
		}
		q.conn.SetWriteDeadline(time.Now().Add(q.cfg.Timeout))
	}
	return nil
}

// sendGathered sends a WRITE of several segments as the data frames a
// WRITE of their concatenation would have: the responder sees an ordinary
// WRITE. Each frame (up to a chunk) goes out with one writev straight from
// the pieces of segments it covers, no copy, checksummed piece by piece; a
// frame ends early where the next segment lies in another region, so each
// frame holds one region against Deregister, as sendWrite's do. Copying
// the pieces into a chunk-sized frame buffer first (as tcp gathers a block
// of several runs) was slower here: 1.25-1.34x the unsharded step in
// BenchmarkReshard's gathered step against 1.15-1.22x (4 KiB pieces, load
// 4): CRC-32 runs over each piece at full speed, and the kernel's
// per-iovec cost is less than a second pass over the bytes.
func (q *qp) sendGathered(w *bufio.Writer, o outbound) error {
	n := o.wr.Length
	chunkSize := uint32(q.pd.dev.p.cfg.ChunkSize)
	type piece struct {
		addr uint64
		n    uint32
	}
	var pieces []piece
	si, in := 0, uint32(0) // the segment the next frame starts in, bytes of it sent
	for off := uint32(0); off < n; {
		m := o.segs[si].mr
		pieces = pieces[:0]
		lo, hi := ^uint64(0), uint64(0)
		c := uint32(0)
		for c < chunkSize && si < len(o.segs) && o.segs[si].mr == m {
			sg := o.segs[si]
			k := min(sg.n-in, chunkSize-c)
			at := sg.addr + uint64(in)
			pieces = append(pieces, piece{at, k})
			lo, hi = min(lo, at), max(hi, at+uint64(k))
			c += k
			if in += k; in == sg.n {
				si, in = si+1, 0
			}
		}
		f := frame{op: opWriteReq, id: o.id, rkey: o.wr.RKey, addr: o.wr.RemoteAddr + uint64(off), length: n}
		if off+c == n {
			f.flags = flagLast
		}
		ok, err := m.io(lo, int(hi-lo), &q.abort, func(span []byte) error {
			v := q.vec[:0]
			for _, p := range pieces {
				v = append(v, span[p.addr-lo:p.addr-lo+uint64(p.n)])
			}
			q.vec = v[:0]
			if c >= directWrite {
				if err := w.Flush(); err != nil {
					return err
				}
				return writeFrameV(q.conn, f, v)
			}
			return writeFrameV(w, f, v)
		})
		if err != nil {
			return err
		}
		if !ok {
			return q.abortWrite(w, o.id, n)
		}
		off += c
		q.conn.SetWriteDeadline(time.Now().Add(q.cfg.Timeout))
	}
	return nil
}

// abortWrite fails WRITE id locally, its local region deregistered while
// it was sent, and ends the request remotely with an empty last chunk with
// a bad key, so the responder drops what it got of the n bytes.
func (q *qp) abortWrite(w *bufio.Writer, id uint64, n uint32) error {
	q.complete(id, rdma.StatusLocalProtection, errors.New("softrdma: local region deregistered during a WRITE"))
	return writeFrame(w, frame{op: opWriteReq, id: id, flags: flagLast, rkey: 0, addr: 0, length: n}, nil, false)
}

// complete finishes a pending work request.
func (q *qp) complete(id uint64, status rdma.Status, err error) {
	q.mu.Lock()
	p := q.pending[id]
	delete(q.pending, id)
	if q.conn != nil && q.Err() == nil {
		q.armLocked()
	}
	q.mu.Unlock()
	if p == nil {
		return
	}
	wc := rdma.Completion{ID: p.wr.ID, Op: p.op, Status: status, Err: err}
	if status == rdma.StatusSuccess {
		wc.Bytes = int(p.wr.Length)
	}
	q.cq.Push(wc)
}

func (q *qp) receive() {
	defer q.wg.Done()
	// Data payloads bypass the buffer (ReadFull into a region reads
	// straight from the socket once the buffer is drained): it only saves
	// syscalls on headers and small frames.
	r := bufio.NewReaderSize(q.conn, 32<<10)
	buf := make([]byte, MaxPayload)
	var h [headerLen]byte
	for {
		f, err := readHeader(r, &h)
		if err != nil {
			q.broken(err)
			return
		}
		if f.op == opReadResp && f.status == 0 {
			err = q.receiveRead(r, &h, f, buf)
		} else {
			payload := buf[:f.payloadLen]
			if err = readPayload(r, &h, f, payload); err != nil {
				q.broken(err)
				return
			}
			err = q.dispatch(f, payload)
		}
		if err != nil {
			var io ioError
			if errors.As(err, &io) {
				q.broken(io.error)
			} else {
				q.fail(err, rdma.StatusRemoteInvalid)
			}
			return
		}
		q.mu.Lock()
		if q.Err() == nil {
			q.armLocked() // progress: the remote answered
		}
		q.mu.Unlock()
	}
}

// ioError marks a failure to read the connection (as opposed to a remote
// that broke the protocol).
type ioError struct{ error }

// broken fails the queue pair after a failed read of its connection.
func (q *qp) broken(err error) {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		q.fail(fmt.Errorf("%w: softrdma: no progress from the remote for %v", fabric.ErrStalled, q.cfg.Timeout), rdma.StatusRetryExceeded)
	case errors.Is(err, fabric.ErrCorrupt):
		q.fail(err, rdma.StatusCorrupt)
	default:
		q.fail(fmt.Errorf("%w: softrdma: %v", fabric.ErrPeerClosed, err), rdma.StatusFlushed)
	}
}

// receiveRead reads one data chunk of a READ straight into the local
// region it is for (the NIC's DMA), then checks its checksum; a chunk
// whose region is gone is read and dropped.
func (q *qp) receiveRead(r *bufio.Reader, h *[headerLen]byte, f frame, buf []byte) error {
	q.mu.Lock()
	p := q.pending[f.id]
	if p != nil && p.op == rdma.OpRead {
		q.receiving = p
	}
	q.mu.Unlock()
	if p == nil || p.op != rdma.OpRead {
		return fmt.Errorf("%w: softrdma: READ response for unknown request %d", fabric.ErrCorrupt, f.id)
	}
	defer func() {
		q.mu.Lock()
		q.receiving = nil
		late := p.late
		q.mu.Unlock()
		err, status := q.Why()
		if late {
			q.cq.Push(rdma.Completion{ID: p.wr.ID, Op: p.op, Status: status, Err: err})
		}
	}()
	if f.addr != uint64(p.got) || uint64(f.payloadLen) > uint64(p.wr.Length-p.got) {
		return fmt.Errorf("%w: softrdma: READ chunk at %d+%d, expected %d of %d", fabric.ErrCorrupt, f.addr, f.payloadLen, p.got, p.wr.Length)
	}
	landed := false
	if p.fail == 0 {
		ok, err := p.local.io(p.wr.LocalAddr+uint64(p.got), int(f.payloadLen), &q.abort, func(dst []byte) error {
			return readPayload(r, h, f, dst)
		})
		if err != nil {
			return ioError{err}
		}
		if !ok {
			p.fail = rdma.StatusLocalProtection // keep consuming the chunks
		}
		landed = ok
	}
	if !landed {
		if err := readPayload(r, h, f, buf[:f.payloadLen]); err != nil {
			return ioError{err}
		}
	}
	p.got += f.payloadLen
	if f.flags&flagLast != 0 {
		switch {
		case p.got != p.wr.Length:
			return fmt.Errorf("%w: softrdma: READ ended after %d of %d bytes", fabric.ErrCorrupt, p.got, p.wr.Length)
		case p.fail != 0:
			q.complete(f.id, p.fail, errors.New("softrdma: local region deregistered during a READ"))
		default:
			q.complete(f.id, rdma.StatusSuccess, nil)
		}
	}
	return nil
}

func (q *qp) dispatch(f frame, payload []byte) error {
	switch f.op {
	case opCallResp:
		ch := q.calls.Take(f.id)
		if ch == nil {
			return nil // the caller gave up
		}
		if f.status != 0 {
			ch <- callResult{err: provbase.RemoteError(payload)}
		} else {
			ch <- callResult{msg: append([]byte(nil), payload...)}
		}
		return nil
	case opWriteResp:
		q.complete(f.id, rdma.Status(f.status), statusErr(rdma.Status(f.status)))
		return nil
	case opReadResp: // a failure status (data chunks go to receiveRead)
		q.mu.Lock()
		p := q.pending[f.id]
		q.mu.Unlock()
		if p == nil || p.op != rdma.OpRead {
			return fmt.Errorf("%w: softrdma: READ response for unknown request %d", fabric.ErrCorrupt, f.id)
		}
		q.complete(f.id, rdma.Status(f.status), statusErr(rdma.Status(f.status)))
		return nil
	}
	return fmt.Errorf("%w: softrdma: unexpected op %d from the responder", fabric.ErrCorrupt, f.op)
}

func statusErr(s rdma.Status) error {
	if s == rdma.StatusSuccess {
		return nil
	}
	return fmt.Errorf("softrdma: remote: %v", s)
}
