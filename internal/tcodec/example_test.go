package tcodec_test

import (
	"bytes"
	"fmt"

	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/tensor"
)

// A block of bf16 weights shrinks by splitting it into byte planes and
// entropy-coding the exponent plane.
func Example() {
	weights := make([]byte, 256<<10)
	tcodec.FillNormal(weights, 2, 0.02, 1)

	enc := tcodec.NewEncoder()
	block, err := enc.AppendBlock(nil, weights, tcodec.HintFor(tensor.BFloat16))
	if err != nil {
		panic(err)
	}
	h, _ := tcodec.ParseHeader(block)
	fmt.Printf("codec %v, %.0f%% of the raw size\n", h.Codec, 100*float64(len(block))/float64(len(weights)))

	got, _, err := tcodec.NewDecoder().DecodeBlock(nil, block)
	fmt.Println("round trip:", err == nil && bytes.Equal(got, weights))
	// Output:
	// codec planes, 67% of the raw size
	// round trip: true
}
