package observe

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/tensor"
)

// The gauges are read at scrape time from what the runtime says then.
func TestMemory(t *testing.T) {
	stats := []tensor.MemStats{{Device: tensor.HostDevice, Used: 10, Capacity: 100}}
	objects := 2
	c := Memory("h0", func() []tensor.MemStats { return stats }, func() int { return objects })
	const want = `
# HELP tensorlane_device_memory_used_bytes Bytes in live allocations on a device.
# TYPE tensorlane_device_memory_used_bytes gauge
tensorlane_device_memory_used_bytes{device="%v",host="h0",simulated="false"} %d
# HELP tensorlane_objects Live objects the runtime owns.
# TYPE tensorlane_objects gauge
tensorlane_objects{host="h0"} %d
`
	for _, tc := range []struct{ used, objects int }{{10, 2}, {30, 5}} {
		stats[0].Used, objects = int64(tc.used), tc.objects
		exp := fmt.Sprintf(want, tensor.HostDevice, tc.used, tc.objects)
		require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(exp), "tensorlane_device_memory_used_bytes", "tensorlane_objects"))
	}
}
