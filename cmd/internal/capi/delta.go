package capi

import (
	"errors"
	"fmt"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/rdt/delta"
)

// DeltaBound is the most bytes DeltaEncode may write for n bytes of
// tensor (delta.Bound: every word changed and incompressible, plus the
// maps and headers), so a caller can size the output once.
func DeltaBound(n int64) int64 { return delta.Bound(n) }

// DeltaEncode writes into out the delta that turns prev into cur (rdt/delta:
// the changed 8-byte words' XOR and where they are, entropy-coded, and
// checksums of both versions) and returns its length and
// the count of elements that changed.
func DeltaEncode(prev, cur, out []byte, elem int) (int, int64, error) {
	return deltaEncode(prev, cur, out, elem, delta.Encode)
}

// DeltaEncodeAdvance is DeltaEncode, and prev becomes cur (delta.
// EncodeAdvance: copied chunk by chunk during the compare, not in a second
// pass), for a publisher that keeps the last version.
func DeltaEncodeAdvance(prev, cur, out []byte, elem int) (int, int64, error) {
	return deltaEncode(prev, cur, out, elem, delta.EncodeAdvance)
}

func deltaEncode(prev, cur, out []byte, elem int, encode func(dst, prev, cur []byte, elem int) ([]byte, delta.Stats, error)) (int, int64, error) {
	if len(prev) != len(cur) || len(cur) == 0 {
		return 0, 0, invalid("delta of %d bytes against a base of %d", len(cur), len(prev))
	}
	if elem != 1 && elem != 2 && elem != 4 && elem != 8 {
		return 0, 0, invalid("element size %d (want 1, 2, 4 or 8)", elem)
	}
	if int64(len(out)) < DeltaBound(int64(len(cur))) {
		return 0, 0, invalid("output of %d bytes: pass at least %d", len(out), DeltaBound(int64(len(cur))))
	}
	d, st, err := encode(out[:0:len(out)], prev, cur, elem)
	if err != nil {
		return 0, 0, invalid("%v", err)
	}
	if len(d) > len(out) || (len(d) > 0 && &d[0] != &out[0]) {
		return 0, 0, invalid("delta of %d bytes outgrew its output", len(d))
	}
	return len(d), st.Changed, nil
}

// DeltaCodecRate is how fast one core of this host runs the delta codec
// now, in bytes of tensor per second per side (delta.CodecRate: measured
// at most every 30 s), for a publisher deciding whether a delta pays.
func DeltaCodecRate() float64 { return delta.CodecRate() }

// DeltaDecode applies a delta to base in place. A base that is not the
// delta's (ErrBaseMismatch) is a layout_mismatch, a bad delta corrupt; on
// any error base is unchanged.
func DeltaDecode(base, d []byte) error { return deltaErr(delta.Decode(base, d)) }

// DeltaRevert undoes DeltaDecode: base must be the delta's result
// (layout_mismatch otherwise) and becomes the version it was made against.
func DeltaRevert(base, d []byte) error { return deltaErr(delta.Revert(base, d)) }

// DeltaCheck reports whether base is the version d was made against,
// changing nothing.
func DeltaCheck(base, d []byte) error { return deltaErr(delta.Check(base, d)) }

func deltaErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, delta.ErrBaseMismatch):
		return fmt.Errorf("%w: %w", rdt.ErrLayoutMismatch, err)
	default:
		return fmt.Errorf("%w: %w", fabric.ErrCorrupt, err)
	}
}
