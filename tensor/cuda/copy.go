package cuda

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/tensorlane/tensorlane/tensor"
)

// lane is one copy at a time: a stream, two events and two pinned staging
// chunks (allocated on the first host copy), used alternately.
type lane struct {
	stream uintptr
	ev     [2]uintptr
	stage  [2]unsafe.Pointer
}

func (m *Memory) setupLanes() error {
	m.lanes = make(chan *lane, m.cfg.Lanes)
	m.events = make(chan uintptr, 2*m.cfg.Lanes)
	return m.drv.on(m.ctx, func() error {
		a := &m.drv.api
		for range m.cfg.Lanes {
			l := &lane{}
			if r := a.cuStreamCreate(&l.stream, streamNonBlocking); r != Success {
				return m.drv.err("cuStreamCreate", r)
			}
			for i := range l.ev {
				if r := a.cuEventCreate(&l.ev[i], eventDisableTiming); r != Success {
					m.freeLaneOn(l)
					return m.drv.err("cuEventCreate", r)
				}
			}
			m.lanes <- l
		}
		return nil
	})
}

// getLane waits for a free lane.
func (m *Memory) getLane(ctx context.Context) (*lane, error) {
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("cuda: %v: %w", m.dev, tensor.ErrClosed)
	}
	select {
	case l := <-m.lanes:
		return l, nil
	case <-m.closing:
		// Close drained the idle lanes and busy ones free themselves, so
		// none will come back.
		return nil, fmt.Errorf("cuda: %v: %w", m.dev, tensor.ErrClosed)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// putLane returns a lane, or frees it when the memory closed meanwhile.
// A lane whose copy never completed is dropped (leaked, with a log line):
// its staging buffers may still be written by the device.
func (m *Memory) putLane(l *lane, hung bool) {
	if hung {
		m.cfg.Logger.Error("cuda: a copy did not complete; its lane is abandoned", "device", m.info.Ordinal)
		return
	}
	// Under mu, as in putEvent: Close sets closed under it and then drains,
	// so a lane put back before that is drained and one put back after is
	// freed here; checking and sending apart let a lane slip in after the
	// drain and leak. The channel holds every lane, so the send never blocks.
	m.mu.Lock()
	closed := m.closed
	if !closed {
		m.lanes <- l
	}
	m.mu.Unlock()
	if closed {
		m.freeLane(l)
	}
}

func (m *Memory) freeLane(l *lane) error {
	return m.drv.on(m.ctx, func() error { return m.freeLaneOn(l) })
}

func (m *Memory) freeLaneOn(l *lane) error {
	a := &m.drv.api
	var errs []error
	for i := range l.stage {
		if l.stage[i] != nil {
			errs = append(errs, m.drv.err("cuMemFreeHost", a.cuMemFreeHost(l.stage[i])))
		}
		if l.ev[i] != 0 {
			errs = append(errs, m.drv.err("cuEventDestroy_v2", a.cuEventDestroy(l.ev[i])))
		}
	}
	if l.stream != 0 {
		errs = append(errs, m.drv.err("cuStreamDestroy_v2", a.cuStreamDestroy(l.stream)))
	}
	return errors.Join(errs...)
}

// staging returns the lane's pinned chunks, allocating them on first use.
// Called with the context current.
func (m *Memory) staging(l *lane) error {
	for i := range l.stage {
		if l.stage[i] != nil {
			continue
		}
		if r := m.drv.api.cuMemHostAlloc(&l.stage[i], uint64(m.cfg.StagingChunk), memHostAllocPortable); r != Success {
			return m.drv.err("cuMemHostAlloc", r)
		}
	}
	return nil
}

func (m *Memory) chunk(l *lane, i int, n int64) []byte {
	return unsafe.Slice((*byte)(l.stage[i]), n)
}

// errHung marks a wait that gave up on the device.
var errHung = errors.New("hung")

// wait returns once event ev has completed: the copies recorded before it
// are done. It polls (cuEventQuery) so that the context is honoured: in a
// tight loop for the first microseconds, yielding the processor until 5 ms
// (most copies end within that: 256 MiB moves in about 0.2 ms on an H200),
// then sleeping a little longer each round, up to a millisecond. A device
// copy cannot be aborted, so a cancelled context does not return at once:
// it waits on, up to CopyTimeout, for the device to stop touching the
// memory, and then returns the context's error. Called with the context
// current.
func (m *Memory) wait(ctx context.Context, ev uintptr) error {
	a := &m.drv.api
	start := time.Now()
	deadline := start.Add(m.cfg.CopyTimeout)
	if d, ok := ctx.Deadline(); ok && d.After(deadline) {
		deadline = d
	}
	var cancelled error
	sleep := 50 * time.Microsecond
	for {
		switch r := a.cuEventQuery(ev); r {
		case Success:
			return cancelled
		case ErrorNotReady:
		default:
			return m.drv.err("cuEventQuery", r)
		}
		if cancelled == nil {
			cancelled = ctx.Err()
		}
		switch el := time.Since(start); {
		case el < 20*time.Microsecond:
			continue
		case el < 5*time.Millisecond:
			runtime.Gosched()
			continue
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: waited %v on %v: %w", ErrCopyTimeout, m.cfg.CopyTimeout, m.dev, errHung)
		}
		time.Sleep(sleep)
		sleep = min(sleep*2, time.Millisecond)
	}
}

// run takes a lane, makes the context current and runs f, and returns the
// lane (or abandons it if f found the device hung).
func (m *Memory) run(ctx context.Context, f func(l *lane) error) error {
	l, err := m.getLane(ctx)
	if err != nil {
		return err
	}
	err = m.drv.on(m.ctx, func() error { return f(l) })
	m.putLane(l, errors.Is(err, errHung))
	return err
}

// CopyIn copies src into the buffer at off (host to device) and returns
// once the bytes are on the device. The bytes move through the lane's two
// pinned chunks: while the device pulls one, the CPU fills the other.
func (b *Buffer) CopyIn(ctx context.Context, off int64, src []byte) error {
	if off < 0 || off+int64(len(src)) > b.n {
		return fmt.Errorf("%w: copy of %d bytes at %d into %d", tensor.ErrTooSmall, len(src), off, b.n)
	}
	done, err := b.use(true)
	if err != nil {
		return err
	}
	defer done()
	m := b.mem
	if m.isPinned(src) {
		return b.direct(ctx, off, src, true)
	}
	return m.run(ctx, func(l *lane) error {
		if err := m.staging(l); err != nil {
			return err
		}
		a := &m.drv.api
		var issued [2]bool
		for i, pos := 0, int64(0); pos < int64(len(src)); i, pos = i^1, pos+m.cfg.StagingChunk {
			if issued[i] {
				if err := m.wait(ctx, l.ev[i]); err != nil {
					return m.drain(ctx, l, issued, err)
				}
			}
			if err := ctx.Err(); err != nil {
				return m.drain(ctx, l, issued, err)
			}
			n := min(m.cfg.StagingChunk, int64(len(src))-pos)
			copy(m.chunk(l, i, n), src[pos:pos+n])
			if r := a.cuMemcpyHtoDAsync(b.ptr+uint64(off+pos), l.stage[i], uint64(n), l.stream); r != Success {
				return m.drain(ctx, l, issued, m.drv.err("cuMemcpyHtoDAsync_v2", r))
			}
			if r := a.cuEventRecord(l.ev[i], l.stream); r != Success {
				return m.drain(ctx, l, issued, m.drv.err("cuEventRecord", r))
			}
			issued[i] = true
		}
		return m.drain(ctx, l, issued, nil)
	})
}

// drain waits for every chunk still in flight on the lane, so its staging
// chunks are idle before it is reused (wait goes on past a cancelled ctx
// until the device is done), and returns err or the first wait's error.
func (m *Memory) drain(ctx context.Context, l *lane, issued [2]bool, err error) error {
	for i := range issued {
		if !issued[i] {
			continue
		}
		if werr := m.wait(ctx, l.ev[i]); werr != nil {
			if errors.Is(werr, errHung) {
				return werr
			}
			if err == nil {
				err = werr
			}
		}
	}
	return err
}

// CopyOut copies len(dst) bytes of the buffer at off into dst (device to
// host) and returns once they are there. The device fills one pinned chunk
// while the CPU empties the other.
func (b *Buffer) CopyOut(ctx context.Context, off int64, dst []byte) error {
	if off < 0 || off+int64(len(dst)) > b.n {
		return fmt.Errorf("%w: copy of %d bytes at %d out of %d", tensor.ErrTooSmall, len(dst), off, b.n)
	}
	done, err := b.use(false)
	if err != nil {
		return err
	}
	defer done()
	m := b.mem
	if m.isPinned(dst) {
		return b.direct(ctx, off, dst, false)
	}
	return m.run(ctx, func(l *lane) error {
		if err := m.staging(l); err != nil {
			return err
		}
		a := &m.drv.api
		total, step := int64(len(dst)), m.cfg.StagingChunk
		var issued [2]bool
		issue := func(i int, pos int64) error {
			n := min(step, total-pos)
			if r := a.cuMemcpyDtoHAsync(l.stage[i], b.ptr+uint64(off+pos), uint64(n), l.stream); r != Success {
				return m.drv.err("cuMemcpyDtoHAsync_v2", r)
			}
			if r := a.cuEventRecord(l.ev[i], l.stream); r != Success {
				return m.drv.err("cuEventRecord", r)
			}
			issued[i] = true
			return nil
		}
		if err := issue(0, 0); err != nil {
			return m.drain(ctx, l, issued, err)
		}
		for i, pos := 0, int64(0); pos < total; i, pos = i^1, pos+step {
			if next := pos + step; next < total {
				if err := issue(i^1, next); err != nil {
					return m.drain(ctx, l, issued, err)
				}
			}
			if err := m.wait(ctx, l.ev[i]); err != nil {
				return m.drain(ctx, l, issued, err)
			}
			issued[i] = false
			n := min(step, total-pos)
			copy(dst[pos:pos+n], m.chunk(l, i, n))
		}
		return nil
	})
}

// CopyFrom copies n bytes of src at srcOff into the buffer at off without
// the host, when src is CUDA memory of the same driver: on one device
// with cuMemcpyDtoDAsync, between devices with cuMemcpyPeerAsync (over
// NVLink or PCIe P2P where the devices reach each other; the driver stages
// otherwise). It reports false for any other src (tensor.Copy then goes
// through host memory).
func (b *Buffer) CopyFrom(ctx context.Context, off int64, src tensor.Buffer, srcOff, n int64) (bool, error) {
	s, ok := src.(*Buffer)
	if !ok || s.mem.drv != b.mem.drv {
		return false, nil
	}
	if n < 0 || off < 0 || srcOff < 0 || off+n > b.n || srcOff+n > s.n {
		return true, fmt.Errorf("%w: copy of %d bytes from [%d of %d] to [%d of %d]", tensor.ErrTooSmall, n, srcOff, s.n, off, b.n)
	}
	if n == 0 {
		return true, nil
	}
	done, err := b.use(true)
	if err != nil {
		return true, err
	}
	defer done()
	if s != b {
		sdone, err := s.use(false)
		if err != nil {
			return true, err
		}
		defer sdone()
	}
	m := b.mem
	return true, m.run(ctx, func(l *lane) error {
		a := &m.drv.api
		var r Result
		op := "cuMemcpyDtoDAsync_v2"
		if s.mem.info.Ordinal == m.info.Ordinal {
			r = a.cuMemcpyDtoDAsync(b.ptr+uint64(off), s.ptr+uint64(srcOff), uint64(n), l.stream)
		} else {
			op = "cuMemcpyPeerAsync"
			r = a.cuMemcpyPeerAsync(b.ptr+uint64(off), m.ctx, s.ptr+uint64(srcOff), s.mem.ctx, uint64(n), l.stream)
		}
		if r != Success {
			return m.drv.err(op, r)
		}
		if r := a.cuEventRecord(l.ev[0], l.stream); r != Success {
			// The copy was queued: wait for the whole stream instead.
			if r2 := a.cuStreamSynchronize(l.stream); r2 != Success {
				return fmt.Errorf("%w (and %w)", m.drv.err("cuEventRecord", r), m.drv.err("cuStreamSynchronize", r2))
			}
			return m.drv.err("cuEventRecord", r)
		}
		return m.wait(ctx, l.ev[0])
	})
}

// EnablePeerAccess lets this device's context reach peer's memory directly
// (cuCtxEnablePeerAccess), so copies between them take NVLink or PCIe P2P.
// Enabling it twice is not an error.
func (m *Memory) EnablePeerAccess(peer *Memory) error {
	if peer.drv != m.drv || peer.info.Ordinal == m.info.Ordinal {
		return nil
	}
	key := [2]int{m.info.Ordinal, peer.info.Ordinal}
	m.drv.mu.Lock()
	done := m.drv.peer[key]
	m.drv.mu.Unlock()
	if done {
		return nil
	}
	err := m.drv.on(m.ctx, func() error {
		switch r := m.drv.api.cuCtxEnablePeerAccess(peer.ctx, 0); r {
		case Success, ErrorPeerAccessEnabled:
			return nil
		default:
			return m.drv.err("cuCtxEnablePeerAccess", r)
		}
	})
	if err == nil {
		m.drv.mu.Lock()
		m.drv.peer[key] = true
		m.drv.mu.Unlock()
	}
	return err
}

// MemcpyBaseline copies n bytes from src to dst with one cuMemcpyDtoDAsync
// (or cuMemcpyPeerAsync) and a stream synchronize, and nothing else: the
// yardstick the GPU check measures Gets against.
func MemcpyBaseline(dst, src *Buffer, n int64) error {
	if n > dst.n || n > src.n {
		return tensor.ErrTooSmall
	}
	m := dst.mem
	l, err := m.getLane(context.Background())
	if err != nil {
		return err
	}
	defer m.putLane(l, false)
	return m.drv.on(m.ctx, func() error {
		a := &m.drv.api
		var r Result
		if src.mem.info.Ordinal == m.info.Ordinal {
			r = a.cuMemcpyDtoDAsync(dst.ptr, src.ptr, uint64(n), l.stream)
		} else {
			r = a.cuMemcpyPeerAsync(dst.ptr, m.ctx, src.ptr, src.mem.ctx, uint64(n), l.stream)
		}
		if r != Success {
			return m.drv.err("cuMemcpy", r)
		}
		return m.drv.err("cuStreamSynchronize", a.cuStreamSynchronize(l.stream))
	})
}

// StartCopyOut starts copying len(dst) bytes of the buffer at off into dst
// and returns before the copy ends (tensor.AsyncCopier): when dst is pinned
// memory of this device, one cuMemcpyDtoHAsync queued on a lane's stream
// with an event of its own recorded behind it; the lane goes back at once,
// the buffer cannot be released until Wait. Other host memory is copied
// by CopyOut on a goroutine (which takes a lane for the copy).
func (b *Buffer) StartCopyOut(ctx context.Context, off int64, dst []byte) (tensor.Pending, error) {
	if off < 0 || off+int64(len(dst)) > b.n {
		return nil, fmt.Errorf("%w: copy of %d bytes at %d out of %d", tensor.ErrTooSmall, len(dst), off, b.n)
	}
	return b.start(ctx, off, dst, false)
}

// StartCopyIn starts copying src into the buffer at off and returns before
// the copy ends; see StartCopyOut.
func (b *Buffer) StartCopyIn(ctx context.Context, off int64, src []byte) (tensor.Pending, error) {
	if off < 0 || off+int64(len(src)) > b.n {
		return nil, fmt.Errorf("%w: copy of %d bytes at %d into %d", tensor.ErrTooSmall, len(src), off, b.n)
	}
	return b.start(ctx, off, src, true)
}

func (b *Buffer) start(ctx context.Context, off int64, host []byte, toDevice bool) (tensor.Pending, error) {
	m := b.mem
	if !m.isPinned(host) {
		// Pageable memory goes through the lane's own staging chunks,
		// which a synchronous copy drives; run one on the side.
		if toDevice {
			return tensor.Go(func() error { return b.CopyIn(ctx, off, host) }), nil
		}
		return tensor.Go(func() error { return b.CopyOut(ctx, off, host) }), nil
	}
	release, err := b.use(toDevice)
	if err != nil {
		return nil, err
	}
	ev, err := m.getEvent()
	if err != nil {
		release()
		return nil, err
	}
	l, err := m.getLane(ctx)
	if err != nil {
		m.putEvent(ev)
		release()
		return nil, err
	}
	err = m.drv.on(m.ctx, func() error {
		a := &m.drv.api
		if err := b.queueDMA(l, off, host, toDevice); err != nil {
			return err
		}
		if r := a.cuEventRecord(ev, l.stream); r != Success {
			// The copy was queued: wait for the whole stream instead.
			a.cuStreamSynchronize(l.stream)
			return m.drv.err("cuEventRecord", r)
		}
		return nil
	})
	// The lane goes back at once: later work on its stream runs after this
	// copy, and the copy's own event marks its end, so a caller that sends
	// for a while before it waits (a slow reader) holds no lane.
	m.putLane(l, false)
	if err != nil {
		m.putEvent(ev)
		release()
		return nil, err
	}
	return &pending{m: m, ev: ev, release: release}, nil
}

// getEvent takes a spare event or creates one.
func (m *Memory) getEvent() (uintptr, error) {
	select {
	case ev := <-m.events:
		return ev, nil
	default:
	}
	var ev uintptr
	err := m.drv.on(m.ctx, func() error {
		return m.drv.err("cuEventCreate", m.drv.api.cuEventCreate(&ev, eventDisableTiming))
	})
	return ev, err
}

// putEvent keeps an event for the next asynchronous copy, or destroys it
// when the memory closed or enough are kept.
func (m *Memory) putEvent(ev uintptr) {
	// Under mu, so that Close (which sets closed under it, then drains)
	// finds every event kept before it.
	m.mu.Lock()
	kept := false
	if !m.closed {
		select {
		case m.events <- ev:
			kept = true
		default:
		}
	}
	m.mu.Unlock()
	if !kept {
		m.destroyEvent(ev)
	}
}

func (m *Memory) destroyEvent(ev uintptr) error {
	return m.drv.on(m.ctx, func() error { return m.drv.err("cuEventDestroy_v2", m.drv.api.cuEventDestroy(ev)) })
}

// pending is a copy queued on a stream, its own event recorded behind it.
type pending struct {
	m       *Memory
	ev      uintptr
	release func() // the buffer's use
	once    sync.Once
	err     error
}

// Wait waits for the copy's event (a cancelled ctx still waits for the
// device, up to CopyTimeout) and keeps the event for the next copy, or
// abandons it when the device never finished.
func (p *pending) Wait(ctx context.Context) error {
	p.once.Do(func() {
		p.err = p.m.drv.on(p.m.ctx, func() error { return p.m.wait(ctx, p.ev) })
		if errors.Is(p.err, errHung) {
			p.m.cfg.Logger.Error("cuda: an asynchronous copy did not complete; its event is abandoned", "device", p.m.info.Ordinal)
		} else {
			p.m.putEvent(p.ev)
		}
		p.release()
	})
	return p.err
}
