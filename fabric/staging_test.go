package fabric_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// devBuf is device memory as far as tensor.Copy can tell: not host
// visible, copied through DeviceCopier.
type devBuf struct{ p []byte }

func (d *devBuf) Device() tensor.DeviceID { return tensor.GPUDevice(0) }
func (d *devBuf) Len() int64              { return int64(len(d.p)) }
func (d *devBuf) Release() error          { return nil }
func (d *devBuf) CopyIn(_ context.Context, off int64, src []byte) error {
	copy(d.p[off:], src)
	return nil
}
func (d *devBuf) CopyOut(_ context.Context, off int64, dst []byte) error {
	copy(dst, d.p[off:])
	return nil
}

func TestStagedRead(t *testing.T) {
	const n = 2*fabric.StageSegment + 12345 // three segments, two halves reused
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i*7 + i>>17)
	}
	dst := &devBuf{p: make([]byte, n)}
	var offs []int64
	fetch := func(_ context.Context, off int64, p []byte) error {
		offs = append(offs, off)
		copy(p, src[off:])
		return nil
	}
	if err := fabric.StagedRead(context.Background(), dst, n, fetch); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst.p, src) {
		t.Fatal("bytes differ")
	}
	if want := []int64{0, fabric.StageSegment, 2 * fabric.StageSegment}; len(offs) != 3 || offs[1] != want[1] || offs[2] != want[2] {
		t.Errorf("segments at %v, want %v", offs, want)
	}

	// A failing segment ends the read with its error, after the copies
	// already started.
	boom := errors.New("boom")
	calls := 0
	err := fabric.StagedRead(context.Background(), &devBuf{p: make([]byte, n)}, n, func(_ context.Context, off int64, p []byte) error {
		if calls++; calls == 2 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("got %v", err)
	}

	// An empty read still asks the owner once.
	calls = 0
	if err := fabric.StagedRead(context.Background(), &devBuf{}, 0, func(context.Context, int64, []byte) error { calls++; return nil }); err != nil || calls != 1 {
		t.Errorf("empty read: %v, %d fetches", err, calls)
	}
}
