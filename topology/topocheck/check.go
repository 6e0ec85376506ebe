// Package topocheck is the conformance suite for topology device plugins
// as a plain function (Check), with what it runs on: a builder of fake
// Linux system trees (Tree) and realistic fixture trees of well-known
// machines (Fixtures). `tensorlane conformance` runs it on the built-in
// plugins; a vendor's tests run it through topology/topotest.Run, which
// turns each check into a subtest.
//
// The suite's checks each belong to a maturity level; the level a plugin
// reaches is the highest one whose checks, and those of every level below,
// all pass (Report.OK says whether that is at least the plugin's declared
// Maturity).
package topocheck

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/tensorlane/tensorlane/topology"
)

// Config configures a conformance run.
type Config struct {
	// Fixtures are trees the plugin must recognise, each with the shape
	// discovery must find. When nil, the built-in fixtures whose Plugin is
	// the plugin's name are used.
	Fixtures []Fixture
	// Hardware says the suite runs on a machine with the plugin's devices
	// (the vendor's hardware CI tier); it enables the Stable checks, which
	// discover the live system.
	Hardware bool
	// Root is the live system root for the hardware checks ("" = "/").
	Root string
	// Cache holds built fixture trees across Check calls; nil builds them
	// afresh for each call.
	Cache *TreeCache
}

// TreeCache builds each fixture tree once, for the checks that only read
// it. Fixtures are known by name. It is safe for concurrent use.
type TreeCache struct {
	dir   string
	mu    sync.Mutex
	built map[string]string
	n     int
}

// NewTreeCache returns a cache that builds trees under dir.
func NewTreeCache(dir string) *TreeCache {
	return &TreeCache{dir: dir, built: map[string]string{}}
}

// Seed makes dir the tree of the named fixture (a committed copy, say).
func (c *TreeCache) Seed(name, dir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.built[name] = dir
}

// Get returns the fixture's tree, building it on first use. Callers must
// not change it.
func (c *TreeCache) Get(f Fixture) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.built[f.Name]; ok {
		return d, nil
	}
	d := filepath.Join(c.dir, fmt.Sprintf("%s-%d", f.Name, c.n))
	c.n++
	if err := f.Build(d); err != nil {
		return "", err
	}
	c.built[f.Name] = d
	return d, nil
}

// Fresh builds a new copy of the fixture's tree that the caller may change.
func (c *TreeCache) Fresh(f Fixture) (string, error) {
	c.mu.Lock()
	d := filepath.Join(c.dir, fmt.Sprintf("%s-%d", f.Name, c.n))
	c.n++
	c.mu.Unlock()
	return d, f.Build(d)
}

// Result is one check's outcome.
type Result struct {
	Name   string            `json:"name"`
	Level  topology.Maturity `json:"level"`
	Passed bool              `json:"passed"`
	// Skipped checks (no hardware) count as not passed for their level.
	Skipped bool   `json:"skipped,omitempty"`
	Msg     string `json:"msg,omitempty"`
}

// Report is the outcome of a conformance run.
type Report struct {
	Plugin   string            `json:"plugin"`
	Declared topology.Maturity `json:"declared"`
	// Verified is the highest level whose checks, and those of the levels
	// below, all passed; -1 when even the Experimental checks failed.
	Verified topology.Maturity `json:"verified"`
	Results  []Result          `json:"results"`
}

// OK reports whether the plugin reached its declared level.
func (r Report) OK() bool { return r.Verified >= r.Declared }

// Failed returns the checks that did not pass (skipped ones included).
func (r Report) Failed() []Result {
	var out []Result
	for _, c := range r.Results {
		if !c.Passed {
			out = append(out, c)
		}
	}
	return out
}

// FixturesFor returns the built-in fixtures that exercise the named plugin.
func FixturesFor(plugin string) []Fixture {
	var out []Fixture
	for _, f := range Fixtures() {
		if f.Plugin == plugin {
			out = append(out, f)
		}
	}
	return out
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// Check runs the suite on p and reports; it needs no testing.T.
func Check(ctx context.Context, p topology.Plugin, cfg Config) (rep Report) {
	rep = Report{Plugin: safeName(p), Declared: safeMaturity(p), Verified: -1}
	tmp, err := os.MkdirTemp("", "topocheck-")
	if err != nil {
		rep.Results = append(rep.Results, Result{Name: "setup", Level: topology.Experimental, Msg: err.Error()})
		return rep
	}
	defer os.RemoveAll(tmp)
	cache := cfg.Cache
	if cache == nil {
		cache = NewTreeCache(tmp)
	}
	fixtures := cfg.Fixtures
	if fixtures == nil {
		fixtures = FixturesFor(rep.Plugin)
	}
	add := func(name string, level topology.Maturity, fn func() error) {
		r := Result{Name: name, Level: level}
		func() {
			defer func() {
				if x := recover(); x != nil {
					r.Msg = fmt.Sprintf("panic: %v", x)
				}
			}()
			err := fn()
			switch {
			case errors.Is(err, errSkip):
				r.Skipped, r.Msg = true, strings.TrimPrefix(err.Error(), errSkip.Error()+": ")
			case err != nil:
				r.Msg = err.Error()
			default:
				r.Passed = true
			}
		}()
		rep.Results = append(rep.Results, r)
	}
	discover := func(root string, env map[string]string) (*topology.Discovery, error) {
		return topology.Discover(ctx, topology.DiscoverConfig{Root: root, Plugins: []topology.Plugin{p},
			Env: func(k string) string { return env[k] }, LabelFiles: []string{}})
	}
	pluginErr := func(d *topology.Discovery) error {
		for _, r := range d.Plugins {
			if r.Err != "" {
				return fmt.Errorf("plugin error: %s", r.Err)
			}
		}
		return nil
	}

	// ---- Experimental ----
	add("name", topology.Experimental, func() error {
		if !nameRE.MatchString(p.Name()) || p.Name() != p.Name() {
			return fmt.Errorf("name %q: want a short, stable, lower-case name", p.Name())
		}
		return nil
	})
	add("maturity", topology.Experimental, func() error {
		m := p.Maturity()
		if m < topology.Experimental || m > topology.Stable {
			return fmt.Errorf("maturity %d out of range", int(m))
		}
		return nil
	})
	add("empty-tree", topology.Experimental, func() error {
		dir := filepath.Join(tmp, "empty")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		d, err := discover(dir, nil)
		if err != nil {
			return err
		}
		if err := pluginErr(d); err != nil {
			return err
		}
		if len(d.Host.Devices) != 0 {
			return fmt.Errorf("%d devices found in an empty tree", len(d.Host.Devices))
		}
		return nil
	})
	add("foreign-trees", topology.Experimental, func() error {
		for _, f := range Fixtures() {
			if f.Plugin == rep.Plugin {
				continue
			}
			dir, err := cache.Get(f)
			if err != nil {
				return err
			}
			d, err := discover(dir, f.Env)
			if err != nil {
				return err
			}
			if err := pluginErr(d); err != nil {
				return fmt.Errorf("%s: %w", f.Name, err)
			}
			if n := len(d.Host.Devices); n > 0 && f.Plugin != "" {
				return fmt.Errorf("%s: claimed %d devices of the %s plugin", f.Name, n, f.Plugin)
			}
			if err := d.Cluster().Validate(); err != nil {
				return fmt.Errorf("%s: %w", f.Name, err)
			}
		}
		return nil
	})
	add("bad-input", topology.Experimental, func() error {
		// One tree, damaged a little more before each discovery.
		tree := Fixture{}
		if len(fixtures) > 0 {
			tree = fixtures[0]
		} else {
			for _, f := range Fixtures() {
				if f.Name == "dgx-h100" {
					tree = f
				}
			}
		}
		dir, err := cache.Fresh(tree)
		if err != nil {
			return err
		}
		for mode := range corruptions {
			if err := corrupt(dir, mode); err != nil {
				return err
			}
			d, err := discover(dir, tree.Env)
			if err != nil {
				return fmt.Errorf("%s+%s: %w", tree.Name, corruptions[mode], err)
			}
			if strings.HasPrefix(d.Plugins[0].Err, "panic") {
				return fmt.Errorf("%s+%s: %s", tree.Name, corruptions[mode], d.Plugins[0].Err)
			}
			if err := d.Cluster().Validate(); err != nil {
				return fmt.Errorf("%s+%s: %w", tree.Name, corruptions[mode], err)
			}
		}
		return nil
	})
	add("idempotent", topology.Experimental, func() error {
		for _, f := range fixtures {
			dir, err := cache.Get(f)
			if err != nil {
				return err
			}
			a, err := discover(dir, f.Env)
			if err != nil {
				return err
			}
			b, err := discover(dir, f.Env)
			if err != nil {
				return err
			}
			if !reflect.DeepEqual(a.Host, b.Host) {
				return fmt.Errorf("%s: two discoveries differ", f.Name)
			}
		}
		return nil
	})
	add("cancel", topology.Experimental, func() error {
		c, cancel := context.WithCancel(ctx)
		cancel()
		_, err := topology.Discover(c, topology.DiscoverConfig{Root: tmp, Plugins: []topology.Plugin{p}})
		if !errors.Is(err, context.Canceled) {
			return fmt.Errorf("discovery with a cancelled context returned %v", err)
		}
		return nil
	})
	add("vendor-ids", topology.Experimental, func() error {
		v, ok := p.(topology.VendorIDer)
		if !ok {
			return nil
		}
		ids := map[uint16]bool{}
		for _, id := range v.VendorIDs() {
			ids[id] = true
		}
		for _, f := range fixtures {
			dir, err := cache.Get(f)
			if err != nil {
				return err
			}
			d, err := discover(dir, f.Env)
			if err != nil {
				return err
			}
			fs := topology.NewFS(dir)
			for _, dev := range d.Host.Devices {
				if dev.BusID == "" {
					continue
				}
				vid, err := fs.ReadHex("sys/bus/pci/devices/" + dev.BusID + "/vendor")
				if err == nil && !ids[uint16(vid)] {
					return fmt.Errorf("%s: device %d at %s has vendor %04x, not one of the plugin's", f.Name, dev.Index, dev.BusID, vid)
				}
			}
		}
		return nil
	})

	// ---- Alpha ----
	var found []*topology.Discovery
	add("fixtures", topology.Alpha, func() error {
		if len(fixtures) == 0 {
			return fmt.Errorf("no fixture trees: give Config.Fixtures")
		}
		for _, f := range fixtures {
			dir, err := cache.Get(f)
			if err != nil {
				return err
			}
			d, err := discover(dir, f.Env)
			if err != nil {
				return err
			}
			if err := pluginErr(d); err != nil {
				return fmt.Errorf("%s: %w", f.Name, err)
			}
			got := shape(d.Host)
			want := f.Want
			want.NICs, want.RDMANICs, want.NUMA = got.NICs, got.RDMANICs, got.NUMA // the core scan's business
			if got != want {
				return fmt.Errorf("%s: found %+v, want %+v", f.Name, got, want)
			}
			found = append(found, d)
		}
		return nil
	})

	// ---- Beta ----
	add("device-fields", topology.Beta, func() error {
		if len(found) == 0 {
			return fmt.Errorf("no fixture discovered")
		}
		for _, d := range found {
			for _, dev := range d.Host.Devices {
				var miss []string
				if dev.Model == "" {
					miss = append(miss, "model")
				}
				if dev.MemoryBytes <= 0 {
					miss = append(miss, "memory")
				}
				if dev.PCIeSwitch == "" {
					miss = append(miss, "pcie switch")
				}
				if dev.NUMA < 0 && len(d.Host.NUMA) > 1 {
					miss = append(miss, "numa")
				}
				if dev.DevNode == "" {
					miss = append(miss, "device node")
				}
				if len(miss) > 0 {
					return fmt.Errorf("%s: device %d lacks %s", d.Host.ID, dev.Index, strings.Join(miss, ", "))
				}
			}
		}
		return nil
	})
	add("round-trip", topology.Beta, func() error {
		if len(found) == 0 {
			return fmt.Errorf("no fixture discovered")
		}
		for _, d := range found {
			b, err := topology.Marshal(d.Cluster())
			if err != nil {
				return err
			}
			back, err := topology.Unmarshal(b)
			if err != nil {
				return err
			}
			if !reflect.DeepEqual(back, d.Cluster()) {
				return fmt.Errorf("%s: the model changes through the topology file", d.Host.ID)
			}
		}
		return nil
	})
	add("links", topology.Beta, func() error {
		for _, d := range found {
			if len(d.Host.Devices) > 1 && len(d.Host.Links) == 0 {
				return fmt.Errorf("%s: %d devices but no device links", d.Host.ID, len(d.Host.Devices))
			}
		}
		return nil
	})

	// ---- Stable ----
	add("hardware", topology.Stable, func() error {
		if !cfg.Hardware {
			return fmt.Errorf("%w: not run on hardware (Config.Hardware, tensorlane conformance --hardware)", errSkip)
		}
		d, err := discover(cfg.Root, nil)
		if err != nil {
			return err
		}
		if err := pluginErr(d); err != nil {
			return err
		}
		if len(d.Host.Devices) == 0 {
			return fmt.Errorf("no devices of the plugin on this machine")
		}
		return nil
	})

	rep.Verified = verified(rep.Results)
	return rep
}

var errSkip = errors.New("skipped")

func verified(rs []Result) topology.Maturity {
	v := topology.Maturity(-1)
	for l := topology.Experimental; l <= topology.Stable; l++ {
		for _, r := range rs {
			if r.Level <= l && !r.Passed {
				return v
			}
		}
		v = l
	}
	return v
}

func shape(h *topology.Host) Want {
	w := Want{Devices: len(h.Devices), NICs: len(h.NICs), NUMA: len(h.NUMA), Links: len(h.Links)}
	for _, n := range h.NICs {
		if n.RDMA() {
			w.RDMANICs++
		}
	}
	return w
}

func safeName(p topology.Plugin) (n string) {
	defer func() {
		if recover() != nil {
			n = "?"
		}
	}()
	return p.Name()
}

func safeMaturity(p topology.Plugin) (m topology.Maturity) {
	defer func() {
		if recover() != nil {
			m = topology.Experimental
		}
	}()
	return p.Maturity()
}

var corruptions = []string{"garbage", "empty", "huge-numbers", "truncated", "link-loops"}

// corrupt damages every third regular file of the tree (and, for
// link-loops, every fourth link) deterministically; modes applied in turn
// add up.
func corrupt(root string, mode int) error {
	var files, links []string
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			links = append(links, p)
		case fi.Mode().IsRegular():
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(files)
	sort.Strings(links)
	if mode == 4 {
		for i, l := range links {
			if i%4 == 0 {
				_ = os.Remove(l)
				if err := os.Symlink(filepath.Base(l), l); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for i, f := range files {
		if i%3 != mode%3 || (mode == 3 && i%2 == 0) {
			continue
		}
		var b []byte
		switch corruptions[mode] {
		case "garbage":
			b = []byte("\xff\xfe\x00garbage\n\x00")
		case "empty":
			b = nil
		case "huge-numbers":
			b = []byte("999999999999999999999999999999 -99999999999999999999\n")
		case "truncated":
			old, _ := os.ReadFile(f)
			b = old[:len(old)/2]
		}
		if err := os.WriteFile(f, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
