package faults

import (
	"runtime"
	"sync"
	"testing"
)

func TestHoldChunk(t *testing.T) {
	var s Sim
	s.HoldChunk() // no hold: returns at once
	gate := make(chan struct{})
	s.Hold.Store(&gate)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(s.HoldChunk)
	}
	for s.Held.Load() != 3 { // Held counts the waiters before they block on the gate
		runtime.Gosched()
	}
	close(gate)
	wg.Wait()
	if s.Held.Load() != 0 || s.HeldMax.Load() != 3 {
		t.Fatalf("held %d (want 0), most at once %d (want 3)", s.Held.Load(), s.HeldMax.Load())
	}
	if (&Sim{}).ReadsBlocked() {
		t.Fatal("the zero Sim is a healthy runtime")
	}
}
