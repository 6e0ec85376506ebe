package capi

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPushRuns: a push of runs of an object (every other 4 KiB of it, then
// one byte) lands their concatenation in the reader's memory, over tcp
// (sent from the object) and shm (copied into the slot); runs that do not fill the
// slot are bad_request, numbers that are not pairs invalid_argument.
func TestPushRuns(t *testing.T) {
	for _, tc := range []struct{ name, config, transport string }{
		{"tcp", `{"allow":["tcp"]}`, "tcp"},
		{"shm", `{"allow":["shm"]}`, "shm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			rs := runtimes(t, tc.config, tc.config)
			owner, reader := rs[0], rs[1]
			src := pattern(1 << 20)
			ref, err := owner.Put(ctx, Region{Mem: src, DType: "uint8", Shape: []int64{1 << 20}})
			require.NoError(t, err)
			var runs []int64
			var want []byte
			for off := int64(0); off < 1<<20; off += 8192 {
				runs = append(runs, off, 4096)
				want = append(want, src[off:off+4096]...)
			}
			runs = append(runs, 1<<20-1, 1)
			want = append(want, src[1<<20-1])
			user := make([]byte, len(want))
			h, slotRef, err := reader.Reserve(ctx, Region{Mem: user, DType: "uint8", Shape: []int64{int64(len(user))}}, SlotGenerations)
			require.NoError(t, err)
			defer reader.SlotClose(h)

			x, err := owner.PushRuns(ctx, ref, slotRef, runs, 5*time.Second)
			require.NoError(t, err)
			assert.Equal(t, tc.transport, x.Transport)
			assert.Equal(t, int64(len(want)), x.Bytes)
			gen, err := reader.SlotWait(ctx, h, 0, 5*time.Second)
			require.NoError(t, err)
			assert.Equal(t, uint64(1), gen)
			assert.True(t, bytes.Equal(want, user), "the runs' bytes, in order, in the caller's memory")
			require.NoError(t, reader.SlotDone(ctx, h, 1))

			_, err = owner.PushRuns(ctx, ref, slotRef, runs[:len(runs)-2], 5*time.Second)
			assert.Equal(t, "bad_request", kindOf(err), "%v", err)
			_, err = owner.PushRuns(ctx, ref, slotRef, runs[:3], 5*time.Second)
			assert.Equal(t, "invalid_argument", kindOf(err), "%v", err)
			_, err = owner.PushRuns(ctx, ref, slotRef, nil, 5*time.Second)
			assert.Equal(t, "invalid_argument", kindOf(err), "%v", err)
		})
	}
}
