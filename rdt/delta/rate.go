package delta

import (
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"time"
)

// rateRefresh: how long a measurement of the codec stands (as the tcp
// codec's: a reading taken while the host was loaded must not hold for
// good; a measurement costs a few milliseconds).
const rateRefresh = 30 * time.Second

// rateSample: bytes of bf16 the measurement encodes and decodes, with
// rateChanged of its elements changed (an Adam step at lr 1e-5 changes
// 8-25% of bf16 weights, and the codec's cost grows with them).
const (
	rateSample  = 1 << 20
	rateChanged = 0.15
)

var (
	rateMu  sync.Mutex
	rateBps float64   // bytes of tensor per second per side, one core
	rateAt  time.Time // when; zero: never
)

// CodecRate is how fast one core of this host runs the codec, in bytes of
// tensor per second per side (encode or decode: the harmonic mean of the
// two, so 2*raw/CodecRate() is the time to encode and decode raw bytes),
// measured on bf16 with 15% of the elements changed at most every 30 s.
// Worth's codecBps: a publisher deciding whether a delta beats the whole
// tensor uses what the host does now, not an assumed rate.
func CodecRate() float64 {
	rateMu.Lock()
	defer rateMu.Unlock()
	if rateAt.IsZero() || time.Since(rateAt) > rateRefresh {
		rateBps = measureRate()
		rateAt = time.Now()
	}
	return rateBps
}

// measureRate encodes and decodes a sample three times and keeps the
// fastest: a process's first rounds fill the codec's pools and tables (its
// first reading was a quarter of the later ones).
func measureRate() float64 {
	r := rand.New(rand.NewPCG(7, 8))
	prev := make([]byte, rateSample)
	for i := 0; i < len(prev); i += 2 {
		// bf16 of N(0, 0.02)-like magnitudes: the exponent byte varies little.
		binary.LittleEndian.PutUint16(prev[i:], 0x3c00|uint16(r.IntN(0x0400))|uint16(r.IntN(2))<<15)
	}
	cur := make([]byte, len(prev))
	copy(cur, prev)
	for i := 0; i < len(cur); i += 2 {
		if r.Float64() < rateChanged {
			cur[i] ^= byte(1 + r.IntN(3)) // an ulp or two
		}
	}
	base := make([]byte, len(prev))
	var d []byte
	best := time.Duration(0)
	for range 3 {
		t0 := time.Now()
		d, _, _ = Encode(d[:0], prev, cur, 2)
		t1 := time.Now()
		copy(base, prev)
		t2 := time.Now()
		if err := Decode(base, d); err != nil {
			return 0 // cannot happen: its own delta of its own base
		}
		if took := t1.Sub(t0) + time.Since(t2); best == 0 || took < best {
			best = took
		}
	}
	return 2 * float64(len(prev)) / max(best, time.Microsecond).Seconds()
}
