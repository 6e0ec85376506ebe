package faults

import "testing"

func TestTakeCorrupt(t *testing.T) {
	var none *Sim
	if none.TakeCorrupt() {
		t.Fatal("a nil Sim is a healthy provider")
	}
	var s Sim
	for i, want := range []bool{false, true, false} {
		if i == 1 {
			s.CorruptNext()
		}
		if got := s.TakeCorrupt(); got != want {
			t.Fatalf("take %d: %v, want %v (one fault, taken once)", i, got, want)
		}
	}
}
