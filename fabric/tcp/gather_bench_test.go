package tcp

import (
	"testing"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/fabrictest"
)

// BenchmarkWriteRuns: a push of a resharded move's bytes (4 KiB rows of a
// row shard, 8 KiB apart: one tensor-parallel half of each row) three
// ways, in turn, owner and pusher in this process: "packed" copies the
// runs into a buffer and Writes it (reshard's pack path), "gathered" is
// WriteRuns, "plain" Writes the same number of contiguous bytes (the
// unsharded push). Reported: the medians of each round's ratios to plain.
func BenchmarkWriteRuns(b *testing.B) {
	const n = 16 << 20
	pf := newPushFixtureWith(b, 2*n, nil)
	tr := pf.transport(b, Config{Compression: CompressOff, StripeMin: 8 << 20})
	var runs []fabric.Run
	for off := int64(0); off < 2*n; off += 8192 {
		runs = append(runs, fabric.Run{Off: off, Len: 4096})
	}
	fabrictest.BenchWriteRuns(b, tr, pf.src, runs, pf.target(0, n))
}
