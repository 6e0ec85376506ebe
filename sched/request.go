package sched

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/tensorlane/tensorlane/topology"
)

// Strategy says how the bundles of a gang spread over hosts, as in Ray
// placement groups.
type Strategy string

const (
	// Pack puts the bundles on as few hosts as possible (the default).
	Pack Strategy = "PACK"
	// Spread puts the bundles on distinct hosts where it can.
	Spread Strategy = "SPREAD"
	// StrictPack puts every bundle on one host or fails.
	StrictPack Strategy = "STRICT_PACK"
	// StrictSpread puts every bundle on a distinct host or fails.
	StrictSpread Strategy = "STRICT_SPREAD"
)

func (s Strategy) valid() bool {
	switch s {
	case "", Pack, Spread, StrictPack, StrictSpread:
		return true
	}
	return false
}

func (s Strategy) orDefault() Strategy {
	if s == "" {
		return Pack
	}
	return s
}

// Level is a topology level a gang can be confined to, smallest first:
// numa < host < nvlink-domain < slice < rack < block < zone. Hosts that lack
// the label of a level form a group of their own at that level (a DGX host
// is its own NVLink domain).
type Level string

const (
	LevelNone         Level = ""
	LevelNUMA         Level = "numa"
	LevelHost         Level = "host"
	LevelNVLinkDomain Level = "nvlink-domain"
	LevelSlice        Level = "slice"
	LevelRack         Level = "rack"
	LevelBlock        Level = "block"
	LevelZone         Level = "zone"
)

// levelRank orders the levels; rankCluster stands for "anywhere".
const (
	rankNUMA = iota
	rankHost
	rankNVLink
	rankSlice
	rankRack
	rankBlock
	rankZone
	rankCluster
	numRanks
)

var levelByRank = [numRanks]Level{LevelNUMA, LevelHost, LevelNVLinkDomain, LevelSlice, LevelRack, LevelBlock, LevelZone, LevelNone}

// levelLabel is the host label that defines a level's groups.
var levelLabel = [numRanks]string{
	rankNVLink: topology.LabelNVLinkDomain,
	rankSlice:  topology.LabelSlice,
	rankRack:   topology.LabelRack,
	rankBlock:  topology.LabelBlock,
	rankZone:   topology.LabelZone,
}

var levelPhrase = [numRanks]string{"one NUMA node", "one host", "one NVLink domain", "one TPU slice", "one rack", "one block", "one zone", "the cluster"}

func (l Level) rank() (int, bool) {
	switch l {
	case LevelNUMA:
		return rankNUMA, true
	case LevelHost:
		return rankHost, true
	case LevelNVLinkDomain:
		return rankNVLink, true
	case LevelSlice:
		return rankSlice, true
	case LevelRack:
		return rankRack, true
	case LevelBlock:
		return rankBlock, true
	case LevelZone:
		return rankZone, true
	case LevelNone:
		return rankCluster, true
	}
	return 0, false
}

// Bundle is one actor's share of a gang: devices of one kind on one host,
// plus CPUs.
type Bundle struct {
	// Kind of device: "gpu", "tpu", "neuron", "hpu"; "" accepts any kind.
	// "cpu" (or Devices == 0) asks for no device.
	Kind topology.DeviceKind `json:"kind,omitempty"`
	// Devices is the number of devices, all on one host.
	Devices int `json:"devices,omitempty"`
	// MemoryGiB is the memory each device must have, in GiB. A bundle
	// without devices asks for this much host memory instead.
	MemoryGiB float64 `json:"memory_gib,omitempty"`
	// CPUs the bundle takes from its host; fractions are allowed.
	CPUs float64 `json:"cpus,omitempty"`
	// Selector filters hosts by label, Ray style: {"accelerator":
	// "in(H100,B200)", "zone": "!us-east-1a", "rack": "rack3"}. Keys are
	// label keys or the short names accelerator, zone, rack, block, slice,
	// nvlink-domain and host (the host ID). Values are "v", "!v", "in(a,b)"
	// or "!in(a,b)". A host without the label matches only negations.
	// accelerator also matches a device model that starts with the value.
	Selector map[string]string `json:"selector,omitempty"`
}

// KindCPU marks a bundle that asks for no device.
const KindCPU topology.DeviceKind = "cpu"

// Topology confines a gang to one group of a level.
type Topology struct {
	// Required: every bundle lies in one group of this level, or the
	// request is infeasible.
	Required Level `json:"required,omitempty"`
	// Preferred: try one group of this level first, then climb level by
	// level up to Required (or the whole cluster) until the gang fits.
	Preferred Level `json:"preferred,omitempty"`
}

// Flow is a traffic matrix entry: bundle From sends to bundle To an offered
// load of Gbps gigabits per second. The cost model's estimated_seconds is
// the time the chosen paths need to carry one second of the whole matrix
// (one step); below 1 the placement keeps up with the load.
type Flow struct {
	From int     `json:"from"`
	To   int     `json:"to"`
	Gbps float64 `json:"gbps"`
}

// Request is a gang of bundles placed all-or-nothing.
type Request struct {
	// Name is free text carried into exports.
	Name     string   `json:"name,omitempty"`
	Strategy Strategy `json:"strategy,omitempty"`
	Bundles  []Bundle `json:"bundles"`
	Topology Topology `json:"topology,omitzero"`
	// NICAffinity requires every device to have an RDMA NIC under its own
	// PCIe switch.
	NICAffinity bool   `json:"nic_affinity,omitempty"`
	Traffic     []Flow `json:"traffic,omitempty"`
}

// Limits that keep a hostile request from asking for unbounded work.
const (
	MaxBundles          = 100000
	MaxDevicesPerBundle = 4096
	MaxFlows            = 1000000
	maxSelectorKeys     = 64
	maxSelectorValues   = 256
)

// ParseRequest decodes a JSON request strictly (unknown fields are errors)
// and validates it. Every failure wraps ErrInvalidRequest.
func ParseRequest(data []byte) (Request, error) {
	return DecodeRequest(bytes.NewReader(data))
}

// DecodeRequest reads one JSON request from r; see ParseRequest.
func DecodeRequest(r io.Reader) (Request, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var req Request
	if err := dec.Decode(&req); err != nil {
		return Request{}, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	if dec.More() {
		return Request{}, fmt.Errorf("%w: trailing data after the request", ErrInvalidRequest)
	}
	if err := req.Validate(); err != nil {
		return Request{}, err
	}
	return req, nil
}

// Validate checks the request; errors wrap ErrInvalidRequest.
func (r Request) Validate() error {
	_, err := compile(r)
	return err
}

func badReq(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidRequest}, args...)...)
}

func finiteNonNeg(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) && v >= 0 }

// selTerm is one compiled selector entry.
type selTerm struct {
	key    string // label key, or "" with host set
	host   bool
	accel  bool
	negate bool
	values []string
	src    string // "key=expr" for messages
}

func parseSelector(key, expr string) (selTerm, error) {
	t := selTerm{src: key + "=" + expr}
	switch key {
	case "accelerator":
		t.key, t.accel = topology.LabelAccelerator, true
	case "zone":
		t.key = topology.LabelZone
	case "rack":
		t.key = topology.LabelRack
	case "block":
		t.key = topology.LabelBlock
	case "slice":
		t.key = topology.LabelSlice
	case "nvlink-domain":
		t.key = topology.LabelNVLinkDomain
	case "host":
		t.host = true
	default:
		if key == "" || strings.TrimSpace(key) != key {
			return t, fmt.Errorf("bad selector key %q", key)
		}
		t.key = key
		t.accel = key == topology.LabelAccelerator
	}
	e := strings.TrimSpace(expr)
	if strings.HasPrefix(e, "!") {
		t.negate = true
		e = strings.TrimSpace(e[1:])
	}
	if strings.HasPrefix(e, "in(") {
		if !strings.HasSuffix(e, ")") {
			return t, fmt.Errorf("selector %s: unclosed in(", key)
		}
		for _, v := range strings.Split(e[3:len(e)-1], ",") {
			v = strings.TrimSpace(v)
			if v == "" {
				return t, fmt.Errorf("selector %s: empty value in %q", key, expr)
			}
			t.values = append(t.values, v)
		}
	} else {
		if e == "" || strings.ContainsAny(e, "(),!") {
			return t, fmt.Errorf("selector %s: bad value %q", key, expr)
		}
		t.values = []string{e}
	}
	if len(t.values) > maxSelectorValues {
		return t, fmt.Errorf("selector %s: more than %d values", key, maxSelectorValues)
	}
	return t, nil
}

func (t selTerm) match(h *topology.Host) bool {
	var in bool
	switch {
	case t.host:
		in = contains(t.values, h.ID)
	default:
		v, ok := h.Labels[t.key]
		if ok {
			for _, want := range t.values {
				if strings.EqualFold(v, want) {
					in = true
					break
				}
			}
		}
		if !in && t.accel {
			in = modelMatches(h, t.values)
		}
	}
	return in != t.negate
}

func modelMatches(h *topology.Host, values []string) bool {
	for _, d := range h.Devices {
		m := strings.ToLower(d.Model)
		for _, v := range values {
			v = strings.ToLower(v)
			if m == v || strings.HasPrefix(m, v+"-") {
				return true
			}
		}
	}
	return false
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// cbundle is a validated bundle.
type cbundle struct {
	Bundle
	kind     topology.DeviceKind // "" = any, KindCPU = none
	devices  int
	memBytes int64 // per device, or host memory for a device-less bundle
	cpuMilli int64
	sel      []selTerm
	class    int // bundles with equal shape share a class
}

// creq is a validated, compiled request.
type creq struct {
	Request
	strategy  Strategy
	required  int // rank
	preferred int // rank, or -1
	bundles   []cbundle
	classes   []int // representative bundle per class
	edges     []edge
	adj       [][]int // bundle -> indices into edges
	traffic   bool
	totalDev  map[topology.DeviceKind]int
	kinds     []topology.DeviceKind // sorted kinds with demand
}

// edge is the summed directed traffic between two bundles, in GB per step.
type edge struct {
	from, to int
	gb       float64
}

func compile(r Request) (*creq, error) {
	c := &creq{Request: r, preferred: -1, totalDev: map[topology.DeviceKind]int{}}
	if !r.Strategy.valid() {
		return nil, badReq("strategy %q: want PACK, SPREAD, STRICT_PACK or STRICT_SPREAD", r.Strategy)
	}
	c.strategy = r.Strategy.orDefault()
	req, ok := r.Topology.Required.rank()
	if !ok {
		return nil, badReq("topology.required %q: want one of numa, host, nvlink-domain, slice, rack, block, zone", r.Topology.Required)
	}
	c.required = req
	if r.Topology.Preferred != "" {
		p, ok := r.Topology.Preferred.rank()
		if !ok {
			return nil, badReq("topology.preferred %q: want one of numa, host, nvlink-domain, slice, rack, block, zone", r.Topology.Preferred)
		}
		if p > req {
			return nil, badReq("topology.preferred %q is wider than topology.required %q", r.Topology.Preferred, r.Topology.Required)
		}
		if p < req {
			c.preferred = p
		}
	}
	if len(r.Bundles) == 0 {
		return nil, badReq("no bundles")
	}
	if len(r.Bundles) > MaxBundles {
		return nil, badReq("%d bundles is more than %d", len(r.Bundles), MaxBundles)
	}
	if len(r.Traffic) > MaxFlows {
		return nil, badReq("%d traffic entries is more than %d", len(r.Traffic), MaxFlows)
	}
	classKey := map[string]int{}
	for i, b := range r.Bundles {
		cb := cbundle{Bundle: b, kind: b.Kind, devices: b.Devices}
		switch b.Kind {
		case "", KindCPU, topology.KindGPU, topology.KindTPU, topology.KindNeuron, topology.KindHPU:
		default:
			return nil, badReq("bundle %d: kind %q: want gpu, tpu, neuron, hpu, cpu or empty", i, b.Kind)
		}
		if b.Devices < 0 || b.Devices > MaxDevicesPerBundle {
			return nil, badReq("bundle %d: devices %d out of range 0..%d", i, b.Devices, MaxDevicesPerBundle)
		}
		if b.Kind == KindCPU && b.Devices > 0 {
			return nil, badReq("bundle %d: kind cpu with %d devices", i, b.Devices)
		}
		if b.Devices == 0 {
			cb.kind = KindCPU
		}
		if !finiteNonNeg(b.MemoryGiB) || b.MemoryGiB > 1<<30 {
			return nil, badReq("bundle %d: memory_gib %v out of range", i, b.MemoryGiB)
		}
		if !finiteNonNeg(b.CPUs) || b.CPUs > 1<<20 {
			return nil, badReq("bundle %d: cpus %v out of range", i, b.CPUs)
		}
		cb.memBytes = int64(math.Ceil(b.MemoryGiB * float64(1<<30)))
		cb.cpuMilli = int64(math.Ceil(b.CPUs * 1000))
		if len(b.Selector) > maxSelectorKeys {
			return nil, badReq("bundle %d: more than %d selector keys", i, maxSelectorKeys)
		}
		keys := make([]string, 0, len(b.Selector))
		for k := range b.Selector {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			t, err := parseSelector(k, b.Selector[k])
			if err != nil {
				return nil, badReq("bundle %d: %v", i, err)
			}
			cb.sel = append(cb.sel, t)
		}
		key := fmt.Sprintf("%s|%d|%d|%d", cb.kind, cb.devices, cb.memBytes, cb.cpuMilli)
		for _, t := range cb.sel {
			key += "|" + t.src
		}
		cl, ok := classKey[key]
		if !ok {
			cl = len(c.classes)
			classKey[key] = cl
			c.classes = append(c.classes, i)
		}
		cb.class = cl
		c.bundles = append(c.bundles, cb)
		if cb.devices > 0 {
			c.totalDev[cb.kind] += cb.devices
		}
	}
	for k := range c.totalDev {
		c.kinds = append(c.kinds, k)
	}
	sort.Slice(c.kinds, func(i, j int) bool { return c.kinds[i] < c.kinds[j] })
	n := len(r.Bundles)
	sum := map[[2]int]float64{}
	var order [][2]int
	for i, f := range r.Traffic {
		if f.From < 0 || f.From >= n || f.To < 0 || f.To >= n {
			return nil, badReq("traffic %d: bundle out of range 0..%d", i, n-1)
		}
		if f.From == f.To {
			return nil, badReq("traffic %d: from and to are both bundle %d", i, f.From)
		}
		if !finiteNonNeg(f.Gbps) || f.Gbps > 1e12 {
			return nil, badReq("traffic %d: gbps %v out of range", i, f.Gbps)
		}
		if f.Gbps == 0 {
			continue
		}
		k := [2]int{f.From, f.To}
		if _, ok := sum[k]; !ok {
			order = append(order, k)
		}
		sum[k] += f.Gbps
	}
	c.adj = make([][]int, n)
	for _, k := range order {
		c.adj[k[0]] = append(c.adj[k[0]], len(c.edges))
		c.adj[k[1]] = append(c.adj[k[1]], len(c.edges))
		c.edges = append(c.edges, edge{from: k[0], to: k[1], gb: sum[k] / 8})
	}
	c.traffic = len(c.edges) > 0
	return c, nil
}
