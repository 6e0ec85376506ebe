package devset

import (
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

func TestOpen(t *testing.T) {
	cl, err := topology.Preset("dgx-h100", 1)
	require.NoError(t, err)
	h := cl.Hosts[0]
	gpu := func(i int) tensor.DeviceID {
		return tensor.DeviceID{Kind: h.Devices[i].Kind, Index: h.Devices[i].Index}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	given := tensor.NewHostMemory(0)
	for _, tc := range []struct {
		name string
		cfg  Config
		want []tensor.DeviceID // nil: err
		err  error
	}{
		{"the host's devices, simulated on a preset", Config{Host: h, Mode: "sim", Log: log},
			append([]tensor.DeviceID{tensor.HostDevice}, func() (ids []tensor.DeviceID) {
				for i := range h.Devices {
					ids = append(ids, gpu(i))
				}
				return
			}()...), nil},
		{"visible ones only", Config{Host: h, Mode: "sim", Visible: []int{3, 1}, Log: log}, []tensor.DeviceID{tensor.HostDevice, gpu(1), gpu(3)}, nil},
		{"a visible index the host lacks", Config{Host: h, Mode: "sim", Visible: []int{99}, Log: log}, nil, errs.UnknownDevice},
		{"given memories, host memory added", Config{Given: []tensor.Memory{given}, Host: h, Log: log}, []tensor.DeviceID{tensor.HostDevice}, nil},
		{"a device given twice", Config{Given: []tensor.Memory{given, given}, Host: h, Log: log}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(tc.cfg)
			if tc.want == nil {
				require.Error(t, err)
				if tc.err != nil {
					require.ErrorIs(t, err, tc.err)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, s.IDs(), "host first, then by kind and index")
			for _, id := range tc.want {
				m, ok := s.Memory(id)
				require.True(t, ok)
				assert.Equal(t, id, m.Device())
			}
			if len(tc.cfg.Given) > 0 {
				m, _ := s.Memory(tensor.HostDevice)
				assert.Same(t, given, m, "a given memory is served as it is")
			}
			require.NoError(t, s.Close())
			require.NoError(t, s.Close(), "idempotent")
		})
	}
}
