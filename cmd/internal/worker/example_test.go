package worker_test

import (
	"errors"
	"fmt"

	"github.com/tensorlane/tensorlane/cmd/internal/worker"
	"github.com/tensorlane/tensorlane/rdt"
)

// A driver in another process sees the code, not the Go error: the code
// names the sentinel the error wraps, and "other" flags an untyped error.
func ExampleErrorCode() {
	fmt.Println(worker.ErrorCode(fmt.Errorf("get: %w", rdt.ErrStaleRef)))
	fmt.Println(worker.ErrorCode(errors.New("something untyped")))
	// Output:
	// stale_ref
	// other
}

// Every put writes the pattern of its seed; every get checks it and names
// the first byte that differs.
func ExampleCheckPattern() {
	p := make([]byte, 20)
	worker.FillPattern(p, 7)
	fmt.Println(worker.CheckPattern(p, 7))
	p[13] ^= 1
	fmt.Println(worker.CheckPattern(p, 7))
	// Output:
	// -1
	// 13
}
