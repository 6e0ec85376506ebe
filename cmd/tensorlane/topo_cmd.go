package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/cmd/internal/envinfo"
	"github.com/tensorlane/tensorlane/sched"
	"github.com/tensorlane/tensorlane/topology"
	"github.com/tensorlane/tensorlane/topology/render"
)

type topoOptions struct {
	preset       string
	hosts        int
	hostsPerRack int
	slice        string
	file         string
	sysfsRoot    string
	host         string
	matrix       bool
	json         bool
	dot          bool
	dump         bool
	rayLabels    bool
	verbose      bool
}

func init() { rootCmd.AddCommand(newTopoCmd()) }

// newTopoCmd builds the command; tests build fresh ones.
func newTopoCmd() *cobra.Command {
	o := topoOptions{}
	cmd := &cobra.Command{
		Use:   "topo",
		Short: "Show the hardware topology: devices, NICs, NUMA, PCIe, device links, domains",
		Long: `topo shows this machine's topology as discovered from sysfs (or a preset, a topology
file, or a sysfs tree copied elsewhere): a tree by default, a device/NIC path matrix in the
style of nvidia-smi topo -m with -m, JSON with --json, Graphviz with --dot, and the topology
file (loadable with --file, and by the library's topology.LoadFile) with --dump.

Path classes: SELF same device; NV# / XGMI / ICI / NL / ROCE# a direct device link; PIX one
PCIe switch; PXB several switches; PHB through a host bridge; NODE across host bridges of one
NUMA node; SYS across NUMA nodes; MNNVL other hosts of one NVLink domain or TPU slice; NET
other hosts over the network.

Presets: ` + strings.Join(topology.Presets(), ", ") + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTopo(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.preset, "preset", "", "show a preset instead of this machine ("+strings.Join(topology.Presets(), ", ")+")")
	f.IntVar(&o.hosts, "hosts", 1, "with --preset: number of hosts")
	f.IntVar(&o.hostsPerRack, "hosts-per-rack", 0, "with --preset: hosts per rack (0 = the preset's default; gb200-nvl72 racks are NVLink domains of at most 18)")
	f.StringVar(&o.slice, "slice", "", "with --preset tpu-v5p: slice shape such as 2x2x4")
	f.StringVar(&o.file, "file", "", "show a topology file (as written by --dump)")
	f.StringVar(&o.sysfsRoot, "sysfs-root", "", "discover from a copied system tree (holding sys/ and dev/, or a sysfs itself) instead of /")
	f.StringVar(&o.host, "host", "", "show only this host (default: all hosts for --json/--dot, the first for the tree and matrix)")
	f.BoolVarP(&o.matrix, "matrix", "m", false, "print the path matrix between devices and NICs")
	f.BoolVar(&o.json, "json", false, "print JSON: hosts (devices with nearest NIC, NICs, NUMA) and domains")
	f.BoolVar(&o.dot, "dot", false, "print a Graphviz graph")
	f.BoolVar(&o.dump, "dump", false, "print the topology file (JSON that --file loads back unchanged)")
	f.BoolVar(&o.rayLabels, "ray-labels", false, "print the ray start --labels each host's Ray node should carry (the vocabulary of place --ray's label selectors)")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "log discovery warnings to stderr as they are found")
	return cmd
}

// topoSource is where the topology came from.
type topoSource struct {
	cluster *topology.Cluster
	render.Source
	plugins []topology.PluginRun
}

func loadTopo(ctx context.Context, stderr io.Writer, o topoOptions) (*topoSource, error) {
	n := 0
	for _, set := range []bool{o.preset != "", o.file != "", o.sysfsRoot != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		return nil, fmt.Errorf("topo: use one of --preset, --file and --sysfs-root")
	}
	switch {
	case o.preset != "":
		if o.hosts < 1 {
			return nil, fmt.Errorf("topo: --hosts must be at least 1, got %d", o.hosts)
		}
		c, err := topology.NewCluster(topology.ClusterSpec{Preset: o.preset, Hosts: o.hosts, HostsPerRack: o.hostsPerRack, SliceShape: o.slice})
		if err != nil {
			return nil, err
		}
		return &topoSource{cluster: c, Source: render.Source{Kind: "preset"}}, nil
	case o.file != "":
		c, err := topology.LoadFile(o.file)
		if err != nil {
			return nil, err
		}
		return &topoSource{cluster: c, Source: render.Source{Kind: "file"}}, nil
	}
	cfg := topology.DiscoverConfig{Root: o.sysfsRoot}
	if o.verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	}
	d, err := topology.Discover(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if o.sysfsRoot == "" {
		// This machine: the CUDA driver's GPUs, with their real memory.
		envinfo.ApplyCUDA(d, envinfo.ProbeCUDA())
	}
	return &topoSource{cluster: d.Cluster(), Source: render.Source{Kind: "discovered", Warnings: d.Warnings}, plugins: d.Plugins}, nil
}

func runTopo(ctx context.Context, w, stderr io.Writer, o topoOptions) error {
	if ctx == nil {
		ctx = context.Background()
	}
	src, err := loadTopo(ctx, stderr, o)
	if err != nil {
		return err
	}
	c := src.cluster
	if o.host != "" {
		h, ok := c.Host(o.host)
		if !ok {
			return fmt.Errorf("topo: no host %q (have %s)", o.host, strings.Join(c.HostIDs(), ", "))
		}
		c = &topology.Cluster{Name: c.Name, Hosts: []*topology.Host{h}}
	}
	switch {
	case o.rayLabels:
		writeRayLabels(w, c, src)
		return nil
	case o.dump:
		return topology.Dump(w, c)
	case o.json:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(render.JSON(c, &src.Source))
	case o.dot:
		return render.Dot(w, c)
	case o.matrix:
		if len(c.Hosts) == 0 {
			return fmt.Errorf("topo: no hosts")
		}
		if len(c.Hosts[0].Devices) == 0 {
			fmt.Fprintln(w, "no accelerator found: the matrix shows NICs only")
		}
		render.Matrix(w, c, c.Hosts[0])
		return nil
	}
	render.Tree(w, c, &src.Source)
	return nil
}

// writeRayLabels prints one ray start line per host, so Ray's label
// selectors (and the placement groups place --ray exports) find the nodes.
func writeRayLabels(w io.Writer, c *topology.Cluster, src *topoSource) {
	for _, h := range c.Hosts {
		labels, skipped := sched.RayNodeLabels(h)
		what := src.Kind
		if h.Simulated {
			what = "simulated, " + what
		}
		fmt.Fprintf(w, "# %s (%s): start its Ray node with\n", h.ID, what)
		fmt.Fprintf(w, "ray start --labels=%q\n", sched.RayStartLabels(labels))
		for _, s := range skipped {
			fmt.Fprintf(w, "# skipped %s: not a valid Ray label\n", s)
		}
	}
}
