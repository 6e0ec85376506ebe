package tcodec

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
)

// data kinds used by the tests and benchmarks.
func gen(kind string, n int) []byte {
	p := make([]byte, n)
	switch kind {
	case "zeros":
	case "bf16":
		FillNormal(p, 2, 0.02, uint64(n))
	case "fp32":
		FillNormal(p, 4, 0.02, uint64(n))
	case "random":
		rand.Read(p)
	case "ramp":
		for i := range p {
			p[i] = byte(i / 1024)
		}
	}
	return p
}

func TestRoundTrip(t *testing.T) {
	hints := map[string]Hint{
		"none": {}, "int32": HintFor(tensor.Int32), "bf16": HintFor(tensor.BFloat16), "fp16": HintFor(tensor.Float16),
		"fp32": HintFor(tensor.Float32), "fp64": HintFor(tensor.Float64), "fp8": HintFor(tensor.Float8E4M3),
	}
	sizes := []int{0, 1, 63, 64, 65, 1001, 4097, segment - 1, 2*segment + 3, MaxBlock - 1, MaxBlock}
	enc, dec := NewEncoder(), NewDecoder()
	data := map[string][]byte{}
	for _, kind := range []string{"zeros", "bf16", "fp32", "random", "ramp"} {
		data[kind] = gen(kind, MaxBlock)
	}
	for hname, hint := range hints {
		for kind, all := range data {
			for _, n := range sizes {
				if n > 2*segment && kind != "bf16" && kind != "random" {
					continue // large blocks of every kind cost minutes under -race
				}
				t.Run(fmt.Sprintf("%s/%s/%d", hname, kind, n), func(t *testing.T) {
					src := all[:n]
					block, err := enc.AppendBlock(nil, src, hint)
					require.NoError(t, err)
					got, rest, err := dec.DecodeBlock(nil, block)
					require.NoError(t, err)
					assert.Empty(t, rest)
					assert.True(t, bytes.Equal(src, got), "round trip differs")
					h, err := ParseHeader(block)
					require.NoError(t, err)
					assert.LessOrEqual(t, h.EncLen, max(n, 0))
					if kind == "random" {
						assert.Equal(t, Raw, h.Codec, "random bytes go raw")
					}
				})
			}
		}
	}
}

// Compressible inputs are actually compressed, with the codec the dtype
// calls for.
func TestCodecChoice(t *testing.T) {
	enc := NewEncoder()
	for _, c := range []struct {
		kind string
		hint Hint
		want Codec
	}{
		{"bf16", HintFor(tensor.BFloat16), Planes},
		{"fp32", HintFor(tensor.Float32), Planes},
		{"zeros", HintFor(tensor.BFloat16), Planes},
		{"ramp", HintFor(tensor.Int8), S2},
		{"ramp", Hint{}, S2},
	} {
		h, _, err := enc.Encode(gen(c.kind, 256<<10), c.hint)
		require.NoError(t, err)
		assert.Equal(t, c.want, h.Codec, "%s %+v", c.kind, c.hint)
		assert.Less(t, h.EncLen, h.RawLen*9/10, "%s %+v", c.kind, c.hint)
	}
	_, _, err := enc.Encode(make([]byte, MaxBlock+1), Hint{})
	assert.Error(t, err)
}

func TestCorruptDetected(t *testing.T) {
	enc, dec := NewEncoder(), NewDecoder()
	for _, c := range []struct {
		kind string
		hint Hint
	}{{"bf16", HintFor(tensor.BFloat16)}, {"fp32", HintFor(tensor.Float32)}, {"ramp", Hint{}}, {"random", Hint{}}, {"zeros", HintFor(tensor.Float16)}} {
		src := gen(c.kind, 100_003)
		block, err := enc.AppendBlock(nil, src, c.hint)
		require.NoError(t, err)
		h, _ := ParseHeader(block)
		// Flip one bit in several places of the payload and the header.
		for _, at := range []int{1, 2, 4, 9, 12, 15, HeaderSize, HeaderSize + 3, HeaderSize + h.EncLen/2, len(block) - 1} {
			bad := bytes.Clone(block)
			bad[at] ^= 0x10
			got, _, err := dec.DecodeBlock(nil, bad)
			if err == nil {
				// A flip can only go unnoticed if it did not change the data.
				assert.True(t, bytes.Equal(got, src), "%s: flip at %d delivered wrong bytes", c.kind, at)
				continue
			}
			assert.ErrorIs(t, err, ErrCorrupt, "%s: flip at %d", c.kind, at)
		}
		_, _, err = dec.DecodeBlock(nil, block[:len(block)-1])
		assert.ErrorIs(t, err, ErrCorrupt, "%s: truncated", c.kind)
		_, _, err = dec.DecodeBlock(nil, block[:7])
		assert.ErrorIs(t, err, ErrCorrupt, "%s: short header", c.kind)
	}
}

func TestHeaderLimits(t *testing.T) {
	var b [HeaderSize]byte
	for name, h := range map[string]Header{
		"too big":       {Codec: Raw, RawLen: MaxBlock + 1, EncLen: MaxBlock + 1},
		"raw mismatch":  {Codec: Raw, RawLen: 10, EncLen: 9},
		"expands":       {Codec: S2, RawLen: 10, EncLen: 11},
		"bad codec":     {Codec: 9, RawLen: 10, EncLen: 9},
		"bad elem":      {Codec: Planes, Elem: 3, RawLen: 10, EncLen: 9},
		"elem on s2":    {Codec: S2, Elem: 2, RawLen: 10, EncLen: 9},
		"planes elem 0": {Codec: Planes, RawLen: 10, EncLen: 9},
	} {
		h.Put(b[:])
		_, err := ParseHeader(b[:])
		assert.ErrorIs(t, err, ErrCorrupt, name)
	}
	h := Header{Codec: Raw, RawLen: 5, EncLen: 5, Sum: 7}
	h.Put(b[:])
	b[2] = 9
	_, err := ParseHeader(b[:])
	assert.True(t, errors.Is(err, ErrCorrupt), "unknown version")
}

func TestSplitJoin(t *testing.T) {
	for _, elem := range []int{1, 2, 4, 8} {
		for _, k := range []int{0, 1, 3, 4, 5, 17, 1000} {
			src := gen("random", elem*k)
			planes := make([]byte, len(src))
			split(planes, src, elem, k)
			for i := range k {
				for p := range elem {
					require.Equal(t, src[i*elem+p], planes[p*k+i])
				}
			}
			back := make([]byte, len(src))
			join(back, planes, elem, k)
			require.Equal(t, src, back)
		}
	}
}

func FuzzDecodeBlock(f *testing.F) {
	enc := NewEncoder()
	for _, c := range []struct {
		kind string
		n    int
		hint Hint
	}{{"bf16", 4096, HintFor(tensor.BFloat16)}, {"fp32", 1000, HintFor(tensor.Float32)}, {"ramp", 3000, Hint{}},
		{"zeros", 500, HintFor(tensor.Float64)}, {"random", 100, Hint{}}, {"bf16", 300, HintFor(tensor.Float8E5M2)}} {
		b, err := enc.AppendBlock(nil, gen(c.kind, c.n), c.hint)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	dec := NewDecoder()
	f.Fuzz(func(t *testing.T, in []byte) {
		var out []byte
		for len(in) > 0 {
			var err error
			before := len(out)
			out, in, err = dec.DecodeBlock(out, in)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("untyped error %v", err)
				}
				return
			}
			if len(out)-before > MaxBlock {
				t.Fatalf("block decoded to %d bytes", len(out)-before)
			}
		}
	})
}

// cpuRate reports cpu-MB/s: bytes per second of CPU time the process
// spent, which, unlike wall-clock MB/s, holds still when other processes
// load the machine (the benchmark is single-threaded).
func cpuRate(b *testing.B, perOp int) func() {
	t0 := testhelp.CPUTime()
	return func() {
		if d := testhelp.CPUTime() - t0; d > 0 {
			b.ReportMetric(float64(perOp)*float64(b.N)/d.Seconds()/1e6, "cpu-MB/s")
		}
	}
}

// BenchmarkCodec measures single-core encode and decode throughput (of raw
// bytes) and reports the compression ratio (encoded/raw).
func BenchmarkCodec(b *testing.B) {
	const n = 256 << 10
	for _, c := range []struct {
		name string
		kind string
		hint Hint
	}{
		{"bf16-normal", "bf16", HintFor(tensor.BFloat16)},
		{"fp32-normal", "fp32", HintFor(tensor.Float32)},
		{"random-as-bf16", "random", HintFor(tensor.BFloat16)},
		{"random-as-bytes", "random", Hint{}},
	} {
		src := gen(c.kind, 64<<20)
		enc, dec := NewEncoder(), NewDecoder()
		var blocks [][]byte
		total := 0
		for off := 0; off < len(src); off += n {
			blk, _ := enc.AppendBlock(nil, src[off:off+n], c.hint)
			blocks = append(blocks, blk)
			total += len(blk)
		}
		ratio := float64(total) / float64(len(src))
		b.Run(c.name+"/encode", func(b *testing.B) {
			b.SetBytes(n)
			b.ReportAllocs()
			defer cpuRate(b, n)()
			i := 0
			for b.Loop() {
				off := (i * n) % len(src)
				i++
				if _, _, err := enc.Encode(src[off:off+n], c.hint); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(ratio, "ratio")
		})
		b.Run(c.name+"/decode", func(b *testing.B) {
			b.SetBytes(n)
			b.ReportAllocs()
			dst := make([]byte, 0, n)
			defer cpuRate(b, n)()
			i := 0
			for b.Loop() {
				blk := blocks[i%len(blocks)]
				i++
				if _, _, err := dec.DecodeBlock(dst[:0], blk); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(ratio, "ratio")
		})
	}
}
