package soak_test

import (
	"os"

	"github.com/tensorlane/tensorlane/cmd/internal/soak"
)

// Print shows a Result as the command does; every attempt must have an
// outcome.
func ExamplePrint() {
	soak.Print(os.Stdout, &soak.Result{
		Transfers: 9, Attempts: 10, BytesMoved: 9 << 20, FaultsInjected: 3, ErrorsSurfaced: 1, Seed: 42, Seconds: 1,
		Outcomes: map[string]int64{"transferred": 9, "error": 1},
		Faults:   map[string]int64{"cut": 2, "kill": 1},
		Errors:   map[string]int64{"get:peer_closed": 1},
		Paths:    map[string]int64{"tcp": 9},
		OK:       true,
	})
	// Output:
	// tensorlane soak: 1.0 s, seed 42 (simulated hosts in one process, loopback)
	// transfers 9 verified of 10 attempts (9437184 bytes), faults injected 3, errors surfaced 1
	// hung 0, bytes corrupted 0, leaked bytes 0 (objects 0), untyped errors 0, forged refs accepted 0
	// attempts: error=1 transferred=9
	// faults: cut=2 kill=1
	// errors: get:peer_closed=1
	// paths: tcp=9
	// longest call 0.00 s, longest kill+restart 0.00 s; ok=true
}
