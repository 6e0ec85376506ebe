package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/sched"
	"github.com/tensorlane/tensorlane/topology"
)

// placeOptions are the flags of tensorlane place.
type placeOptions struct {
	preset       string
	racks        int
	hosts        int
	hostsPerRack int
	request      string
	state        string
	reserve      string
	jsonOut      bool
	ray          bool
}

func newPlaceCmd() *cobra.Command {
	var o placeOptions
	cmd := &cobra.Command{
		Use:   "place",
		Short: "Place a gang of bundles on a simulated cluster, topology-aware",
		Long: `place runs the placement scheduler (package sched) for one request on a
simulated cluster built from a topology preset, optionally on top of a saved
state, and prints the placement: feasible, every reason when it is not, one
assignment per bundle (host, devices, NUMA node) and the estimated transfer
time of one step of the request's traffic.

  tensorlane place --preset gb200-nvl72 --racks 2 --request req.json --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runPlace(cmd.InOrStdin(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.preset, "preset", "gb200-nvl72", "topology preset of every host")
	f.IntVar(&o.racks, "racks", 0, "number of racks (hosts = racks x hosts per rack)")
	f.IntVar(&o.hosts, "hosts", 0, "number of hosts (default: racks x hosts per rack, or 1)")
	f.IntVar(&o.hostsPerRack, "hosts-per-rack", 0, "hosts per rack (default: the preset's rack size, 4 for presets without one)")
	f.StringVar(&o.request, "request", "", "request JSON file, or - for stdin (required)")
	f.StringVar(&o.state, "state", "", "scheduler state JSON file (reservations, failures) to place against")
	f.StringVar(&o.reserve, "reserve", "", "reserve the placement under this ID and write the new state back to --state")
	f.BoolVar(&o.jsonOut, "json", false, "print JSON")
	f.BoolVar(&o.ray, "ray", false, "print the placement as a Ray placement-group spec (JSON)")
	return cmd
}

func init() { rootCmd.AddCommand(newPlaceCmd()) }

// placeOutput is the --json shape.
type placeOutput struct {
	Feasible         bool               `json:"feasible"`
	Reasons          []string           `json:"reasons"`
	Assignments      []sched.Assignment `json:"assignments"`
	EstimatedSeconds float64            `json:"estimated_seconds"`
	Span             string             `json:"span,omitempty"`
	Group            string             `json:"group,omitempty"`
	Notes            []string           `json:"notes,omitempty"`
}

func buildPlaceCluster(o placeOptions) (*topology.Cluster, error) {
	perRack := o.hostsPerRack
	if perRack < 0 || o.racks < 0 || o.hosts < 0 {
		return nil, errors.New("place: --racks, --hosts and --hosts-per-rack must not be negative")
	}
	hosts := o.hosts
	if o.racks > 0 && perRack == 0 {
		perRack = presetRackSize(o.preset)
	}
	if hosts == 0 {
		hosts = 1
		if o.racks > 0 {
			hosts = o.racks * perRack
		}
	}
	if o.racks > 0 && hosts > o.racks*perRack {
		return nil, fmt.Errorf("place: %d hosts do not fit %d racks of %d", hosts, o.racks, perRack)
	}
	if hosts > topology.MaxPresetHosts {
		return nil, fmt.Errorf("place: %d hosts is more than %d", hosts, topology.MaxPresetHosts)
	}
	return topology.PresetCluster(o.preset, hosts, perRack)
}

// presetRackSize finds the preset's default rack size by building a small
// cluster (topology keeps the table private); presets that put every host
// in one rack get 4 hosts per rack.
func presetRackSize(preset string) int {
	const probe = 64
	c, err := topology.PresetCluster(preset, probe, 0)
	if err != nil {
		return 4
	}
	n := 0
	for _, h := range c.Hosts {
		if h.Labels[topology.LabelRack] == c.Hosts[0].Labels[topology.LabelRack] {
			n++
		}
	}
	if n >= probe {
		return 4
	}
	return n
}

func runPlace(stdin io.Reader, out io.Writer, o placeOptions) error {
	if o.request == "" {
		return errors.New("place: --request is required")
	}
	if o.reserve != "" && o.state == "" {
		return errors.New("place: --reserve needs --state to write to")
	}
	c, err := buildPlaceCluster(o)
	if err != nil {
		return err
	}
	var r io.Reader = stdin
	if o.request != "-" {
		f, err := os.Open(o.request)
		if err != nil {
			return fmt.Errorf("place: %w", err)
		}
		defer f.Close()
		r = f
	}
	req, err := sched.DecodeRequest(r)
	if err != nil {
		return fmt.Errorf("place: %s: %w", o.request, err)
	}
	s, err := sched.New(c, sched.Config{})
	if err != nil {
		return err
	}
	if o.state != "" {
		raw, err := os.ReadFile(o.state)
		switch {
		case errors.Is(err, os.ErrNotExist) && o.reserve != "":
			// A new state file.
		case err != nil:
			return fmt.Errorf("place: %w", err)
		default:
			var st sched.State
			if err := json.Unmarshal(raw, &st); err != nil {
				return fmt.Errorf("place: state %s: %w", o.state, err)
			}
			if err := s.Restore(st); err != nil {
				return fmt.Errorf("place: state %s: %w", o.state, err)
			}
		}
	}
	var p sched.Placement
	if o.reserve != "" {
		p, err = s.Reserve(o.reserve, req)
	} else {
		p, err = s.Place(req)
	}
	if err != nil && !errors.Is(err, sched.ErrInfeasible) {
		return fmt.Errorf("place: %w", err)
	}
	if o.reserve != "" && p.Feasible {
		raw, err := json.MarshalIndent(s.State(), "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.state, append(raw, '\n'), 0o644); err != nil {
			return fmt.Errorf("place: %w", err)
		}
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	switch {
	case o.ray:
		spec, err := sched.RaySpec(req, p)
		if err != nil {
			return err
		}
		if err := enc.Encode(spec); err != nil {
			return err
		}
	case o.jsonOut:
		if err := enc.Encode(placeOutput{Feasible: p.Feasible, Reasons: p.Reasons, Assignments: p.Assignments,
			EstimatedSeconds: p.EstimatedSeconds, Span: p.Span, Group: p.Group, Notes: p.Notes}); err != nil {
			return err
		}
	default:
		printPlacement(out, c, p)
	}
	if !p.Feasible {
		return errPlaceInfeasible
	}
	return nil
}

// count says "1 host", "2 hosts".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// errPlaceInfeasible makes the command exit non-zero after printing an
// infeasible placement.
var errPlaceInfeasible = errors.New("place: request is infeasible")

func printPlacement(out io.Writer, c *topology.Cluster, p sched.Placement) {
	fmt.Fprintf(out, "cluster %s (%s)\n", c.Name, count(len(c.Hosts), "host"))
	if !p.Feasible {
		fmt.Fprintln(out, "infeasible:")
		for _, r := range p.Reasons {
			fmt.Fprintf(out, "  - %s\n", r)
		}
		return
	}
	fmt.Fprintf(out, "feasible, within %s %s, estimated %.6g s per step\n", p.Span, p.Group, p.EstimatedSeconds)
	for _, a := range p.Assignments {
		fmt.Fprintf(out, "  bundle %-3d %-8s devices %v numa %d\n", a.Bundle, a.Host, a.Devices, a.NUMA)
	}
	for _, n := range p.Notes {
		fmt.Fprintf(out, "  note: %s\n", n)
	}
}
