package sched

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/topology"
)

func TestRayNodeLabels(t *testing.T) {
	for _, tc := range []struct {
		preset string
		want   string
	}{
		{"gb200-nvl72", "ray.io/accelerator-type=GB200,tensorlane.io/host=h1,topology.tensorlane.io/nvlink-domain=nvl72-0,topology.tensorlane.io/rack=rack0"},
		{"tpu-v5p", "ray.io/accelerator-type=tpu-v5p,ray.io/tpu-slice-name=slice0,tensorlane.io/host=h1,topology.tensorlane.io/rack=rack0,topology.tensorlane.io/slice-shape=2x2x2,topology.tensorlane.io/slice-worker=1"},
	} {
		t.Run(tc.preset, func(t *testing.T) {
			c, err := topology.Preset(tc.preset, 2)
			require.NoError(t, err)
			h, _ := c.Host("h1")
			labels, skipped := RayNodeLabels(h)
			assert.Empty(t, skipped)
			assert.Equal(t, tc.want, RayStartLabels(labels))
		})
	}
}

// The labels a node starts with are the ones RaySpec's selectors ask for.
func TestRayNodeLabelsMatchRaySpec(t *testing.T) {
	c, err := topology.Preset("gb200-nvl72", 2)
	require.NoError(t, err)
	for k := range rayLabel {
		h := c.Hosts[0]
		if _, ok := h.Labels[k]; !ok {
			continue
		}
		labels, _ := RayNodeLabels(h)
		assert.Equal(t, h.Labels[k], labels[rayLabel[k]], k)
	}
}

func TestRayNodeLabelsSkipsInvalid(t *testing.T) {
	h := &topology.Host{ID: "node 1", Labels: map[string]string{"team": "ml", "bad key!": "x", "note": "a,b"}}
	labels, skipped := RayNodeLabels(h)
	assert.Equal(t, map[string]string{"team": "ml"}, labels)
	assert.ElementsMatch(t, []string{"bad key!=x", "note=a,b", "tensorlane.io/host=node 1"}, skipped)
}
