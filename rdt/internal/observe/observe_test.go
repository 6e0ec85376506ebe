package observe

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
)

func TestRing(t *testing.T) {
	o := New()
	assert.Equal(t, 0.0, testutil.ToFloat64(o.Errors.WithLabelValues("object_freed")), "every kind starts at zero")
	type end = func(fabric.Plan, fabric.Stats, error)
	ends := make([]end, 0, Recent+10)
	for i := range Recent + 10 {
		ends = append(ends, o.Begin(Record{Start: time.Now(), Reader: fmt.Sprintf("r%d", i), Bytes: 10}))
	}
	live := o.Live()
	require.Len(t, live, Recent+10)
	assert.True(t, live[0].Live)
	assert.Equal(t, "r0", live[0].Reader)
	plan := fabric.Plan{Chosen: fabric.RDMA, Best: fabric.RDMA}
	for i, e := range ends {
		if i%2 == 1 {
			e(plan, fabric.Stats{}, fmt.Errorf("read: %w", fabric.ErrStalled))
			continue
		}
		e(plan, fabric.Stats{Transport: fabric.TCP, Bytes: 10}, nil)
	}
	assert.Empty(t, o.Live())
	rec := o.Finished()
	require.Len(t, rec, Recent, "bounded ring")
	assert.Equal(t, fmt.Sprintf("r%d", Recent+9), rec[0].Reader, "newest first")
	assert.Equal(t, "r10", rec[len(rec)-1].Reader)
	assert.Equal(t, "stalled", rec[0].ErrorKind)
	assert.Equal(t, fabric.RDMA, rec[0].Path, "a failed transfer names the path it chose")
	assert.True(t, rec[1].Fallback, "tcp moved the bytes although the plan chose rdma")
	assert.False(t, rec[1].Live)
	assert.Equal(t, float64((Recent+10)/2), testutil.ToFloat64(o.Errors.WithLabelValues("stalled")))
}
