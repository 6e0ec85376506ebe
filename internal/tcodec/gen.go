package tcodec

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
)

// FillNormal fills p with little-endian elements of dt-like layout drawn
// from a normal distribution (mean 0, standard deviation std), the shape
// of trained weights. elem 2 writes bfloat16, elem 4 float32; a trailing
// partial element is left as it is. It exists for tests and benchmarks
// here and in the transports that use the codec.
func FillNormal(p []byte, elem int, std float64, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	switch elem {
	case 2:
		for i := 0; i+2 <= len(p); i += 2 {
			binary.LittleEndian.PutUint16(p[i:], bf16(float32(r.NormFloat64()*std)))
		}
	case 4:
		for i := 0; i+4 <= len(p); i += 4 {
			binary.LittleEndian.PutUint32(p[i:], math.Float32bits(float32(r.NormFloat64()*std)))
		}
	default:
		panic("tcodec: FillNormal supports bf16 (2) and float32 (4)")
	}
}

// bf16 rounds f to bfloat16, nearest even.
func bf16(f float32) uint16 {
	b := math.Float32bits(f)
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}
