package sched

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/topology"
)

// A golden scenario file has three sections:
//
//	-- topology --   lines that build the cluster (see buildTopology)
//	-- script --     commands run in order (see runScript)
//	-- want --       the transcript the script must produce
//
// Lines before the first section and lines starting with # are comments.
// go test -run TestGolden -update rewrites the want sections.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			require.NoError(t, err)
			sec := sections(string(raw))
			c, err := buildTopology(sec["topology"])
			require.NoError(t, err)
			got := runScript(t, c, sec["script"])
			if testhelp.Updating() {
				out := sec["_head"] + "-- topology --\n" + sec["topology"] + "-- script --\n" + sec["script"] + "-- want --\n" + got
				require.NoError(t, os.WriteFile(f, []byte(out), 0o644))
				return
			}
			require.Equal(t, sec["want"], got, "golden %s differs (rerun with -update if the change is intended)", f)
		})
	}
}

func sections(s string) map[string]string {
	out := map[string]string{}
	cur := "_head"
	for _, line := range strings.SplitAfter(s, "\n") {
		trim := strings.TrimSpace(line)
		if strings.HasPrefix(trim, "-- ") && strings.HasSuffix(trim, " --") {
			cur = strings.TrimSuffix(strings.TrimPrefix(trim, "-- "), " --")
			continue
		}
		if line == "" {
			continue
		}
		out[cur] += line
	}
	return out
}

// buildTopology understands:
//
//	preset NAME hosts=N [per-rack=M] [racks-per-block=K] [zone=Z] [slice=AxBxC] [prefix=P]
//	label HOST KEY=VALUE      (KEY may be a short level name: rack, zone, ...)
//	no-rdma HOST              (the host's NICs lose RDMA)
//
// Several preset lines append hosts; prefix renames their IDs (P0, P1, ...)
// and racks (P-rack0, ...) so that they stay unique.
func buildTopology(spec string) (*topology.Cluster, error) {
	c := &topology.Cluster{Name: "golden"}
	for _, line := range strings.Split(spec, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		kv := map[string]string{}
		for _, x := range f[1:] {
			if k, v, ok := strings.Cut(x, "="); ok {
				kv[k] = v
			}
		}
		atoi := func(k string) int { n, _ := strconv.Atoi(kv[k]); return n }
		switch f[0] {
		case "preset":
			pc, err := topology.NewCluster(topology.ClusterSpec{Preset: f[1], Hosts: atoi("hosts"), HostsPerRack: atoi("per-rack"),
				RacksPerBlock: atoi("racks-per-block"), Zone: kv["zone"], SliceShape: kv["slice"]})
			if err != nil {
				return nil, err
			}
			if p := kv["prefix"]; p != "" {
				for _, h := range pc.Hosts {
					h.ID = p + strings.TrimPrefix(h.ID, "h")
					for _, k := range []string{topology.LabelRack, topology.LabelNVLinkDomain, topology.LabelSlice, topology.LabelBlock} {
						if v := h.Labels[k]; v != "" {
							h.Labels[k] = p + "-" + v
						}
					}
				}
			}
			c.Hosts = append(c.Hosts, pc.Hosts...)
		case "label":
			h, ok := c.Host(f[1])
			if !ok {
				return nil, fmt.Errorf("label: no host %s", f[1])
			}
			k, v, _ := strings.Cut(f[2], "=")
			if t, err := parseSelector(k, "x"); err == nil && t.key != "" {
				k = t.key
			}
			h.Labels[k] = v
		case "no-rdma":
			h, ok := c.Host(f[1])
			if !ok {
				return nil, fmt.Errorf("no-rdma: no host %s", f[1])
			}
			for i := range h.NICs {
				h.NICs[i].RDMADevice = ""
			}
		default:
			return nil, fmt.Errorf("unknown topology line %q", line)
		}
	}
	return c, c.Validate()
}

// runScript runs the commands and renders a transcript:
//
//	place JSON            place without reserving
//	reserve ID JSON       place and reserve
//	release ID
//	fail-host HOST | fail-device HOST INDEX | restore-host HOST
//	state                 the reservations, one line per bundle
//	ray JSON              place and print the Ray placement-group export
func runScript(t *testing.T, c *topology.Cluster, script string) string {
	s, err := New(c, Config{})
	require.NoError(t, err)
	var b strings.Builder
	for _, line := range strings.Split(script, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cmd, rest, _ := strings.Cut(line, " ")
		fmt.Fprintf(&b, "> %s\n", cmd+" "+abbrev(rest))
		switch cmd {
		case "place", "reserve", "ray":
			id := ""
			if cmd == "reserve" {
				id, rest, _ = strings.Cut(rest, " ")
			}
			req, err := ParseRequest([]byte(rest))
			if err != nil {
				fmt.Fprintf(&b, "error: %v\n", err)
				continue
			}
			var p Placement
			if cmd == "reserve" {
				p, err = s.Reserve(id, req)
			} else {
				p, err = s.Place(req)
			}
			if err != nil && p.Feasible {
				t.Fatalf("feasible placement with error %v", err)
			}
			if cmd == "ray" && p.Feasible {
				spec, err := RaySpec(req, p)
				require.NoError(t, err)
				j, _ := json.MarshalIndent(spec, "  ", "  ")
				fmt.Fprintf(&b, "  %s\n", j)
				continue
			}
			renderPlacement(&b, p)
		case "release":
			if err := s.Release(rest); err != nil {
				fmt.Fprintf(&b, "error: %v\n", err)
			}
		case "fail-host", "fail-device":
			var rs []Rescheduled
			if cmd == "fail-host" {
				rs, err = s.FailHost(rest)
			} else {
				h, d, _ := strings.Cut(rest, " ")
				n, _ := strconv.Atoi(d)
				rs, err = s.FailDevice(h, n)
			}
			if err != nil {
				fmt.Fprintf(&b, "error: %v\n", err)
				continue
			}
			for _, r := range rs {
				if r.Evicted {
					fmt.Fprintf(&b, "%s evicted\n", r.ID)
				} else {
					fmt.Fprintf(&b, "%s moved bundles %v\n", r.ID, r.Moved)
				}
				renderPlacement(&b, r.Placement)
			}
		case "restore-host":
			if err := s.RestoreHost(rest); err != nil {
				fmt.Fprintf(&b, "error: %v\n", err)
			}
		case "state":
			st := s.State()
			for _, r := range st.Reservations {
				fmt.Fprintf(&b, "%s:", r.ID)
				for _, a := range r.Assignments {
					fmt.Fprintf(&b, " %s%v", a.Host, a.Devices)
				}
				b.WriteString("\n")
			}
			if len(st.FailedHosts) > 0 || len(st.FailedDevices) > 0 {
				fmt.Fprintf(&b, "failed: %v %v\n", st.FailedHosts, st.FailedDevices)
			}
		default:
			t.Fatalf("unknown script command %q", cmd)
		}
	}
	return b.String()
}

func abbrev(s string) string {
	if len(s) > 160 {
		return s[:157] + "..."
	}
	return s
}

func renderPlacement(b *strings.Builder, p Placement) {
	if !p.Feasible {
		b.WriteString("infeasible\n")
		for _, r := range p.Reasons {
			fmt.Fprintf(b, "  reason: %s\n", r)
		}
		return
	}
	fmt.Fprintf(b, "feasible span=%s", p.Span)
	if p.Group != "" {
		fmt.Fprintf(b, " group=%s", p.Group)
	}
	fmt.Fprintf(b, " est=%.6gs\n", p.EstimatedSeconds)
	// Group bundles with identical rendering to keep big gangs short.
	hosts := map[string][]string{}
	var order []string
	for _, a := range p.Assignments {
		line := fmt.Sprintf("%s%v numa=%d", a.Host, a.Devices, a.NUMA)
		if _, ok := hosts[a.Host]; !ok {
			order = append(order, a.Host)
		}
		hosts[a.Host] = append(hosts[a.Host], fmt.Sprintf("b%d=%s", a.Bundle, line))
	}
	_ = sort.Strings
	for _, h := range order {
		fmt.Fprintf(b, "  %s\n", strings.Join(hosts[h], " "))
	}
	for _, n := range p.Notes {
		fmt.Fprintf(b, "  note: %s\n", n)
	}
}
