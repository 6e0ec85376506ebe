package rdt

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// TestPushRuns: a push of runs of an object lands their concatenation in
// the slot, with nothing packed on every path here: over tcp from host
// memory the runs go out straight from the object (a gathered write), over
// rdma as WRITEs whose scatter-gather lists are the runs (softrdma's; a
// provider that takes one segment per WRITE packs inside the transport,
// counted there), over shm copied from the object straight into the
// slot's mapped pages. A path without fabric.GatherWriter (and device
// memory the CPU cannot address, on any path; the simulated devices here
// it can) packs into staging memory first, which
// tensorlane_gather_packed_total counts (fabric's TestWriteRunsGathersOrPacks).
// The slot's generation advances once per push either way.
func TestPushRuns(t *testing.T) {
	ctx := context.Background()
	noRDMA := func(c *Config) { c.Transports.DisableRDMA = true }
	otherHost := func(p pair, _ *Runtime) *Actor { a, _ := p.b.Spawn("slot"); return a }
	tests := []struct {
		name   string
		mutate func(*Config)
		reader func(p pair, c *Runtime) *Actor
		src    tensor.DeviceID
		path   string
	}{
		{"other host over tcp, host memory: gathered", noRDMA, otherHost, tensor.HostDevice, fabric.TCP},
		{"other host over tcp, (simulated, CPU-visible) device memory: gathered", noRDMA, otherHost, tensor.GPUDevice(0), fabric.TCP},
		{"other host over rdma: gathered", nil, otherHost, tensor.HostDevice, fabric.RDMA},
		{"same host, other runtime over shm: gathered", nil, func(_ pair, c *Runtime) *Actor { a, _ := c.Spawn("slot"); return a }, tensor.HostDevice, fabric.SHM},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, tc.mutate)
			c := sameHostRuntime(t, p, tc.mutate)
			owner, _ := p.a.Spawn("trainer")
			reader := tc.reader(p, c)
			// A 96x40 bf16 shard; the slot takes its columns 8..28 (40 bytes
			// of each 80-byte row), then one byte of its last row.
			x := fill(t, p.a, tc.src, tensor.BFloat16, 96, 40)
			src, err := owner.Put(ctx, x)
			require.NoError(t, err)
			var runs []Run
			for row := range int64(96) {
				runs = append(runs, Run{Off: row*80 + 16, Len: 40})
			}
			runs = append(runs, Run{Off: 96*80 - 1, Len: 1})
			n := fabric.RunsBytes(runs)
			whole, err := x.SpanBytes()
			require.NoError(t, err)
			var want []byte
			for _, r := range runs {
				want = append(want, whole[r.Off:r.Off+r.Len]...)
			}

			slot, err := reader.Reserve(ctx, tensor.NewDesc(tensor.Uint8, n), tensor.HostDevice)
			require.NoError(t, err)
			defer slot.Close()
			packedBefore := counter(t, p.a, "tensorlane_gather_packed_total")
			for step := uint64(1); step <= 2; step++ {
				xfer, err := owner.Push(ctx, src, slot.Ref(), PushRuns(runs))
				require.NoError(t, err)
				assert.Equal(t, tc.path, xfer.Stats.Transport)
				assert.Equal(t, n, xfer.Stats.Bytes)
				got, _, err := slot.Wait(ctx, step-1)
				require.NoError(t, err)
				assert.Equal(t, step, got)
				assert.True(t, bytes.Equal(want, slot.s.Buf.(tensor.HostVisible).Bytes()[:n]), "slot differs from the packed runs")
			}
			packed := counter(t, p.a, "tensorlane_gather_packed_total") - packedBefore
			assert.Zero(t, packed, "gathered: nothing packed")
			assert.Equal(t, uint64(2), slot.Pushes())
		})
	}
}

// TestPushRunsRefused: runs that do not fill the slot exactly, or leave
// the object, fail the push with ErrBadRuns before anything moves: the
// slot's generation stays.
func TestPushRunsRefused(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, func(c *Config) { c.Transports.DisableRDMA = true })
	owner, _ := p.a.Spawn("trainer")
	reader, _ := p.b.Spawn("slot")
	x := fill(t, p.a, tensor.HostDevice, tensor.Uint8, 100)
	src, err := owner.Put(ctx, x)
	require.NoError(t, err)
	slot, err := reader.Reserve(ctx, tensor.NewDesc(tensor.Uint8, 10), tensor.HostDevice)
	require.NoError(t, err)
	defer slot.Close()
	for _, tc := range []struct {
		name string
		runs []Run
	}{
		{"nil", nil},
		{"short", []Run{{Off: 0, Len: 9}}},
		{"long", []Run{{Off: 0, Len: 6}, {Off: 50, Len: 5}}},
		{"outside the object", []Run{{Off: 95, Len: 10}}},
		{"empty run", []Run{{Off: 0, Len: 0}, {Off: 0, Len: 10}}},
		{"overflowing", []Run{{Off: 1 << 62, Len: 1 << 62}, {Off: 0, Len: 10}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := owner.Push(ctx, src, slot.Ref(), PushRuns(tc.runs))
			require.ErrorIs(t, err, ErrBadRuns)
			assert.Zero(t, slot.Pushes())
		})
	}
	// Without the option the sizes must match, as before.
	_, err = owner.Push(ctx, src, slot.Ref())
	require.ErrorIs(t, err, ErrTooSmall)
	_, err = owner.Push(ctx, src, slot.Ref(), PushRuns([]Run{{Off: 90, Len: 10}}))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), slot.Pushes())
}
