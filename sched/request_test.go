package sched

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/topology"
)

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name, json string
		wantErr    bool
	}{
		{"issue example", `{"strategy":"PACK","bundles":[{"kind":"gpu","devices":4,"memory_gib":40,"cpus":8,"selector":{"accelerator":"in(H100,B200)","zone":"!us-east-1a"}}],"topology":{"required":"nvlink-domain","preferred":"host"},"nic_affinity":true,"traffic":[]}`, false},
		{"traffic", `{"bundles":[{"devices":1},{"devices":1}],"traffic":[{"from":0,"to":1,"gbps":100}]}`, false},
		{"cpu bundle", `{"bundles":[{"kind":"cpu","cpus":0.5}]}`, false},
		{"no bundles", `{"bundles":[]}`, true},
		{"unknown field", `{"bundles":[{"devices":1}],"x":1}`, true},
		{"trailing data", `{"bundles":[{"devices":1}]} {}`, true},
		{"bad strategy", `{"strategy":"pack","bundles":[{"devices":1}]}`, true},
		{"bad level", `{"bundles":[{"devices":1}],"topology":{"required":"planet"}}`, true},
		{"preferred wider", `{"bundles":[{"devices":1}],"topology":{"required":"numa","preferred":"host"}}`, true},
		{"negative devices", `{"bundles":[{"devices":-1}]}`, true},
		{"too many devices", `{"bundles":[{"devices":5000}]}`, true},
		{"cpu kind with devices", `{"bundles":[{"kind":"cpu","devices":1}]}`, true},
		{"bad kind", `{"bundles":[{"kind":"fpga","devices":1}]}`, true},
		{"negative memory", `{"bundles":[{"devices":1,"memory_gib":-1}]}`, true},
		{"self traffic", `{"bundles":[{"devices":1}],"traffic":[{"from":0,"to":0,"gbps":1}]}`, true},
		{"traffic out of range", `{"bundles":[{"devices":1}],"traffic":[{"from":0,"to":1,"gbps":1}]}`, true},
		{"negative gbps", `{"bundles":[{"devices":1},{"devices":1}],"traffic":[{"from":0,"to":1,"gbps":-3}]}`, true},
		{"empty selector value", `{"bundles":[{"devices":1,"selector":{"zone":""}}]}`, true},
		{"bad in()", `{"bundles":[{"devices":1,"selector":{"zone":"in(a,,b)"}}]}`, true},
		{"not json", `{"bundles":`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRequest([]byte(tt.json))
			if tt.wantErr {
				require.ErrorIs(t, err, ErrInvalidRequest)
			} else {
				require.NoError(t, err)
			}
		})
	}
}

func TestSelectorMatch(t *testing.T) {
	h := &topology.Host{ID: "h1", Labels: map[string]string{topology.LabelZone: "us-east-1a", topology.LabelAccelerator: "GB200"},
		Devices: []topology.Device{{Index: 0, Model: "B200-186GB"}}}
	tests := []struct {
		key, expr string
		want      bool
	}{
		{"zone", "us-east-1a", true},
		{"zone", "!us-east-1a", false},
		{"zone", "in(us-east-1b,us-east-1a)", true},
		{"zone", "!in(us-east-1b)", true},
		{"accelerator", "GB200", true},
		{"accelerator", "in(H100,B200)", true}, // device model B200-186GB
		{"accelerator", "H100", false},
		{"host", "h1", true},
		{"host", "!in(h1,h2)", false},
		{"rack", "rack0", false}, // missing label
		{"rack", "!rack0", true},
		{"example.com/pool", "!in(a)", true},
	}
	for _, tt := range tests {
		term, err := parseSelector(tt.key, tt.expr)
		require.NoError(t, err)
		require.Equal(t, tt.want, term.match(h), "%s=%s", tt.key, tt.expr)
	}
}

// FuzzParseRequest: the decoder never panics, and whatever it accepts can
// be placed (or refused) without panicking either.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"strategy":"PACK","bundles":[{"kind":"gpu","devices":4,"memory_gib":40,"cpus":8,"selector":{"accelerator":"in(H100,B200)","zone":"!us-east-1a"}}],"topology":{"required":"nvlink-domain","preferred":"host"},"nic_affinity":true,"traffic":[{"from":0,"to":0,"gbps":100}]}`,
		`{"strategy":"STRICT_SPREAD","bundles":[{"devices":1},{"devices":2},{"kind":"cpu","cpus":1.5,"memory_gib":3}],"traffic":[{"from":0,"to":1,"gbps":1e3},{"from":2,"to":1,"gbps":5}]}`,
		`{"bundles":[{"kind":"tpu","devices":4}],"topology":{"required":"slice"}}`,
		`{"bundles":[{"devices":1e400}]}`,
		`[]`, `null`, `{}`,
	} {
		f.Add([]byte(s))
	}
	c, err := topology.PresetCluster("gb200-nvl72", 4, 2)
	if err != nil {
		f.Fatal(err)
	}
	s, err := New(c, Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := ParseRequest(data)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidRequest)
			return
		}
		if len(req.Bundles) > 64 {
			return // keep each fuzz input cheap
		}
		p, err := s.Place(req)
		if err != nil {
			require.ErrorIs(t, err, ErrInfeasible)
			return
		}
		require.Len(t, p.Assignments, len(req.Bundles))
	})
}
