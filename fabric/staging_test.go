package fabric_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
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

// logBuf is a devBuf with asynchronous copies out (tensor.AsyncCopier)
// that logs when each starts; the copy itself is done at once.
type logBuf struct {
	devBuf
	log  *[]string
	fail int64 // the copy out at this offset fails (-1: none)
}

type waited struct{ err error }

func (w waited) Wait(context.Context) error { return w.err }

func (d *logBuf) StartCopyOut(ctx context.Context, off int64, dst []byte) (tensor.Pending, error) {
	*d.log = append(*d.log, fmt.Sprintf("copy %d", off/fabric.StageSegment))
	if off == d.fail {
		return waited{errors.New("device fault")}, nil
	}
	return waited{d.devBuf.CopyOut(ctx, off, dst)}, nil
}

func (d *logBuf) StartCopyIn(ctx context.Context, off int64, src []byte) (tensor.Pending, error) {
	return waited{d.devBuf.CopyIn(ctx, off, src)}, nil
}

// A staged push moves segment by segment, each pushed at its offset, and
// segment i+1's device copy is started before segment i is pushed (and
// waited for before segment i+2's starts: one in flight). A copy that
// fails ends the push with its error once the push under way is done.
func TestWriteStaged(t *testing.T) {
	const n = 2*fabric.StageSegment + 12345
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*11 + i>>15)
	}
	var log []string
	src := &logBuf{devBuf: devBuf{p: want}, log: &log, fail: -1}
	got := make([]byte, n)
	write := func(_ context.Context, off int64, p []byte) (fabric.Stats, error) {
		log = append(log, fmt.Sprintf("push %d", off/fabric.StageSegment))
		copy(got[off:], p)
		return fabric.Stats{Transport: "x", Bytes: int64(len(p)), Streams: 1}, nil
	}
	st, err := fabric.WriteStaged(context.Background(), "x", src, n, write)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) || st.Bytes != n {
		t.Fatalf("bytes differ (%d of %d)", st.Bytes, n)
	}
	if w := []string{"copy 0", "copy 1", "push 0", "copy 2", "push 1", "push 2"}; fmt.Sprint(log) != fmt.Sprint(w) {
		t.Errorf("order %v, want %v", log, w)
	}

	log = nil
	src.fail = fabric.StageSegment
	_, err = fabric.WriteStaged(context.Background(), "x", src, n, write)
	if err == nil || !strings.Contains(err.Error(), "device fault") {
		t.Errorf("failing copy: %v", err)
	}
	if w := []string{"copy 0", "copy 1", "push 0"}; fmt.Sprint(log) != fmt.Sprint(w) {
		t.Errorf("order %v, want %v", log, w)
	}
}

// inBuf is a devBuf with asynchronous copies in that log their ranges.
type inBuf struct {
	devBuf
	mu  sync.Mutex
	log []string
}

func (d *inBuf) StartCopyIn(ctx context.Context, off int64, src []byte) (tensor.Pending, error) {
	d.mu.Lock()
	d.log = append(d.log, fmt.Sprintf("%d+%d", off, len(src)))
	d.mu.Unlock()
	return waited{d.devBuf.CopyIn(ctx, off, src)}, nil
}

func (d *inBuf) StartCopyOut(ctx context.Context, off int64, dst []byte) (tensor.Pending, error) {
	return waited{d.devBuf.CopyOut(ctx, off, dst)}, nil
}

// A transport that reports bytes as they arrive (two stripes of a segment,
// each in 1 MiB blocks, one restarting as a retried stripe does) has them
// copied into the device a piece at a time before the fetch returns; the
// gaps are copied after it, and every byte lands once the read returns.
func TestStagedReadProgress(t *testing.T) {
	const mib = 1 << 20
	const n = fabric.StageSegment + 10*mib + 7 // two segments
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i*5 + i>>13)
	}
	dst := &inBuf{devBuf: devBuf{p: make([]byte, n)}}
	var duringFetch []int
	fetch := func(_ context.Context, off int64, p []byte, received fabric.Received) error {
		half := int64(len(p)) / 2
		for _, r := range [][2]int64{{0, half}, {half, int64(len(p))}} {
			for pos := r[0]; pos < r[1]; pos += mib {
				end := min(pos+mib, r[1])
				copy(p[pos:end], src[off+pos:off+end])
				received(r[0], end-r[0])
				if r[0] == 0 && end-r[0] == 6*mib {
					received(r[0], 2*mib) // a retried stripe starting over: ignored
				}
			}
		}
		dst.mu.Lock()
		duringFetch = append(duringFetch, len(dst.log))
		dst.mu.Unlock()
		return nil
	}
	if err := fabric.StagedReadProgress(context.Background(), dst, n, fetch); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst.p, src) {
		t.Fatal("bytes differ")
	}
	if len(duringFetch) != 2 || duringFetch[0] < 4 {
		t.Errorf("copies started while the first segment was fetched: %v (log %v), want 4 or more", duringFetch, dst.log)
	}
}
