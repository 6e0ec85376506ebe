package kit

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
)

// Conn is what a Pool holds: a connection, by pointer (comparable), that
// Close releases.
type Conn interface {
	comparable
	Close() error
}

// PoolConfig configures a Pool.
type PoolConfig[K comparable, C Conn] struct {
	// Dial makes a new connection to k (required). It runs without the
	// pool's lock and must honour ctx.
	Dial func(ctx context.Context, k K) (C, error)
	// MaxConns is the most connections open to one key at once, idle or
	// busy; a Get that finds them all busy waits (as long as its ctx
	// allows) for the first one given back. Default 16.
	MaxConns int
	// MaxIdle is how many idle connections are kept per key; default
	// MaxConns.
	MaxIdle int
	// IdleTimeout closes connections idle for longer (checked whenever a
	// connection to the same key is given back); 0 keeps them.
	IdleTimeout time.Duration
	// OnWait and OnDial, when set, count Gets that had to queue and
	// connections dialed (metrics).
	OnWait, OnDial func()
}

// Pool is a set of connections per key (an owner's data service): Get
// hands out an idle connection, dials a new one while fewer than MaxConns
// are open, or queues the caller (oldest first) for the next one given
// back, so a burst of transfers cannot make a storm of handshakes or
// exhaust the owner's sockets. A connection goes back with Put when it is
// still in step, or Discard when it is broken. Close closes every
// connection and fails every waiter with fabric.ErrClosed.
type Pool[K comparable, C Conn] struct {
	cfg PoolConfig[K, C]

	mu     sync.Mutex
	keys   map[K]*keyPool[C]
	all    map[C]K // every connection open, for Close and Put's key
	closed bool
}

type keyPool[C Conn] struct {
	idle    []idleConn[C] // most recently used last
	open    int           // connections open or being dialed, idle or busy
	waiters []chan C      // Gets waiting, oldest first; a zero C hands over a slot
}

type idleConn[C Conn] struct {
	c     C
	since time.Time
}

// NewPool returns an empty pool.
func NewPool[K comparable, C Conn](cfg PoolConfig[K, C]) *Pool[K, C] {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 16
	}
	if cfg.MaxIdle <= 0 {
		cfg.MaxIdle = cfg.MaxConns
	}
	return &Pool[K, C]{cfg: cfg, keys: map[K]*keyPool[C]{}, all: map[C]K{}}
}

// Get returns a connection to k. pooled reports one that carried a
// request before, which the owner may have closed since (a transport
// retries such a failure once on a fresh connection).
func (p *Pool[K, C]) Get(ctx context.Context, k K) (c C, pooled bool, err error) {
	var zero C
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return zero, false, fabric.ErrClosed
	}
	kp := p.keys[k]
	if kp == nil {
		kp = &keyPool[C]{}
		p.keys[k] = kp
	}
	if n := len(kp.idle); n > 0 {
		c = kp.idle[n-1].c
		kp.idle[n-1] = idleConn[C]{}
		kp.idle = kp.idle[:n-1]
		p.mu.Unlock()
		return c, true, nil
	}
	if kp.open < p.cfg.MaxConns {
		kp.open++
		p.mu.Unlock()
		return p.dialSlot(ctx, k)
	}
	w := make(chan C, 1)
	kp.waiters = append(kp.waiters, w)
	p.mu.Unlock()
	if p.cfg.OnWait != nil {
		p.cfg.OnWait()
	}
	select {
	case c, ok := <-w:
		return p.handed(ctx, k, c, ok)
	case <-ctx.Done():
	}
	p.mu.Lock()
	if i := slices.Index(kp.waiters, w); i >= 0 {
		kp.waiters = slices.Delete(kp.waiters, i, i+1)
		p.forgetLocked(k, kp)
		p.mu.Unlock()
		return zero, false, ctx.Err()
	}
	p.mu.Unlock()
	// Handed a connection (or a slot) just as ctx ended: pass it on.
	if c, ok := <-w; ok {
		if c != zero {
			p.Put(c)
		} else {
			p.release(k)
		}
	}
	return zero, false, ctx.Err()
}

// handed takes what a waiter was given: a connection, a zero C (the slot
// of a connection that closed: dial one), or nothing (the pool closed).
func (p *Pool[K, C]) handed(ctx context.Context, k K, c C, ok bool) (C, bool, error) {
	var zero C
	switch {
	case !ok:
		return zero, false, fabric.ErrClosed
	case c != zero:
		return c, true, nil
	}
	return p.dialSlot(ctx, k)
}

// dialSlot dials for a slot already counted in k's open connections, and
// gives the slot back if that fails.
func (p *Pool[K, C]) dialSlot(ctx context.Context, k K) (C, bool, error) {
	var zero C
	c, err := p.cfg.Dial(ctx, k)
	if err != nil {
		p.release(k)
		return zero, false, err
	}
	if p.cfg.OnDial != nil {
		p.cfg.OnDial()
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.Close()
		return zero, false, fabric.ErrClosed
	}
	p.all[c] = k
	p.mu.Unlock()
	return c, false, nil
}

// handOff gives c (or, when zero, the slot of a connection that closed)
// to the oldest waiter, and reports whether there was one.
func (kp *keyPool[C]) handOff(c C) bool {
	if len(kp.waiters) == 0 {
		return false
	}
	kp.waiters[0] <- c // buffered: never blocks
	kp.waiters[0] = nil
	kp.waiters = kp.waiters[1:]
	return true
}

// release gives back the slot of a connection that closed or was never
// made.
func (p *Pool[K, C]) release(k K) {
	var zero C
	p.mu.Lock()
	defer p.mu.Unlock()
	kp := p.keys[k]
	if kp == nil { // the pool closed
		return
	}
	if !kp.handOff(zero) {
		kp.open--
		p.forgetLocked(k, kp)
	}
}

// forgetLocked drops k's entry once nothing uses it, so the map does not
// grow with every owner ever read from.
func (p *Pool[K, C]) forgetLocked(k K, kp *keyPool[C]) {
	if kp.open == 0 && len(kp.waiters) == 0 {
		delete(p.keys, k)
	}
}

// Put gives back a connection that is in step: to a waiting Get, else to
// the idle list while it has room, else it is closed. Idle connections
// unused for IdleTimeout are closed on the way.
func (p *Pool[K, C]) Put(c C) {
	now := time.Now()
	var drop []C
	p.mu.Lock()
	k, ok := p.all[c]
	kp := p.keys[k]
	switch {
	case p.closed || !ok || kp == nil:
		drop = append(drop, c)
	case kp.handOff(c):
	case len(kp.idle) < p.cfg.MaxIdle:
		kp.idle = append(kp.idle, idleConn[C]{c, now})
	default:
		drop = append(drop, c)
		kp.open--
	}
	if kp != nil && p.cfg.IdleTimeout > 0 {
		for len(kp.idle) > 0 && now.Sub(kp.idle[0].since) > p.cfg.IdleTimeout {
			drop = append(drop, kp.idle[0].c)
			kp.idle[0] = idleConn[C]{}
			kp.idle = kp.idle[1:]
			kp.open--
		}
	}
	for _, d := range drop {
		delete(p.all, d)
	}
	if kp != nil {
		p.forgetLocked(k, kp)
	}
	p.mu.Unlock()
	for _, d := range drop {
		d.Close()
	}
}

// Discard closes a connection that is out of step or broken and frees
// its slot.
func (p *Pool[K, C]) Discard(c C) {
	c.Close()
	p.mu.Lock()
	k, ok := p.all[c]
	delete(p.all, c)
	p.mu.Unlock()
	if ok {
		p.release(k)
	}
}

// Stats says, for tests and debugging, how many connections to k are open
// (idle or busy) and idle, and how many the pool holds in all.
func (p *Pool[K, C]) Stats(k K) (open, idle, all int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if kp := p.keys[k]; kp != nil {
		open, idle = kp.open, len(kp.idle)
	}
	return open, idle, len(p.all)
}

// Close closes every connection (transfers using one fail at once) and
// fails every waiting Get with fabric.ErrClosed. Idempotent.
func (p *Pool[K, C]) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	all := p.all
	for _, kp := range p.keys {
		for _, w := range kp.waiters {
			close(w)
		}
	}
	p.all, p.keys = nil, nil
	p.mu.Unlock()
	for c := range all {
		c.Close()
	}
	return nil
}
