package topology

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMaturityJSON(t *testing.T) {
	for _, tc := range []struct {
		m    Maturity
		json string
	}{{Experimental, `"experimental"`}, {Beta, `"beta"`}, {Stable, `"stable"`}, {-1, `"none"`}} {
		b, err := json.Marshal(tc.m)
		require.NoError(t, err)
		assert.Equal(t, tc.json, string(b))
		var back Maturity
		require.NoError(t, json.Unmarshal(b, &back))
		assert.Equal(t, tc.m, back)
	}
	var old Maturity
	require.NoError(t, json.Unmarshal([]byte(`2`), &old), "numbers from older output still read")
	assert.Equal(t, Beta, old)
	assert.Error(t, json.Unmarshal([]byte(`"gamma"`), &old))
}
