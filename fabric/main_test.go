package fabric_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The planner starts goroutines for batches (ReadBatch, WriteBatch): none
// may outlive the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
