package archtest

import (
	"fmt"
	"slices"
	"strings"
)

// Module is the module path the rules' package names are relative to.
const Module = "github.com/tensorlane/tensorlane"

// Rule forbids the packages of one tree to import others.
type Rule struct {
	// Tree is a package path relative to the module; it covers the package
	// and every package below it.
	Tree string
	// MustNot lists trees (relative paths) the packages of Tree must not
	// import.
	MustNot []string
	// Except lists packages below Tree that the rule does not cover.
	Except []string
	// Why says, briefly, what the rule keeps true.
	Why string
}

// Rules are the import rules of docs/architecture.md.
var Rules = []Rule{
	{Tree: "tensor", MustNot: []string{"fabric", "rdt", "sched", "bench", "dashboard"},
		Why: "device memory and tensor views sit at the bottom: every layer uses them"},
	{Tree: "topology", MustNot: []string{"fabric", "rdt", "sched", "bench", "dashboard"},
		Why: "the hardware model sits at the bottom: fabric and sched read it"},
	{Tree: "fabric", MustNot: []string{"rdt", "sched", "bench", "dashboard"},
		Why: "transports move bytes for any caller; the user API is built on them, not in them"},
	{Tree: "rdt", MustNot: []string{"sched", "bench", "dashboard"}, Except: []string{"rdt/placement"},
		Why: "the runtime does not decide placement; rdt/placement joins the two"},
	{Tree: "rdt", MustNot: []string{"fabric/local", "fabric/shm", "fabric/rdma", "fabric/tcp", "fabric/linkstat"},
		Why: "fabric/stack builds, tunes and closes the transports; the user API reaches them through it and fabric's interfaces"},
	{Tree: "rdt/internal", MustNot: []string{"fabric/stack"},
		Why: "rdt's machinery behind its front (broadcast, the control plane's wire) sees transports only through fabric's interfaces, handed to it by the Runtime"},
	{Tree: "rdt/internal/errs", MustNot: rdtEngines,
		Why: "rdt's conditions are the leaf every package behind rdt returns"},
	{Tree: "rdt/internal/ctlwire", MustNot: rdtEngines,
		Why: "the control plane's one table of kinds and statuses, and its codecs, are wire vocabulary every engine shares"},
	{Tree: "rdt/internal/refwire", MustNot: rdtEngines,
		Why: "the Ref's wire form is vocabulary every engine shares"},
	{Tree: "rdt/internal/batchplan", MustNot: rdtEngines,
		Why: "grouping a batch's plans for Explain is a pure function of the plans"},
	{Tree: "rdt/internal/bcast", MustNot: rdtEngines,
		Why: "the broadcast's planner, tree, windows and codec need no runtime"},
	{Tree: "rdt/internal/objstore", MustNot: without(rdtEngines, "rdt/internal/objstore"),
		Why: "the object and slot tables hold state; the protocols act on them through their methods, never the other way"},
	{Tree: "rdt/internal/bcastrun", MustNot: without(rdtEngines, "rdt/internal/bcastrun", "rdt/internal/objstore"),
		Why: "the broadcast engine reaches its runtime through Env only, and fills objstore's slots"},
	{Tree: "rdt/internal/peers", MustNot: without(rdtEngines, "rdt/internal/peers"),
		Why: "the failure detector reaches its runtime through Prober only"},
	{Tree: "rdt/internal/leases", MustNot: without(rdtEngines, "rdt/internal/leases"),
		Why: "the reader's lease table sends through Leaser only"},
	{Tree: "rdt/internal/notices", MustNot: without(rdtEngines, "rdt/internal/notices"),
		Why: "the notice sender knows streams and status bytes, not what the notices do"},
	{Tree: "rdt/internal/ctlmsg", MustNot: without(rdtEngines, "rdt/internal/ctlmsg"),
		Why: "the actor-message protocol hands messages to the runtime's inboxes through a callback"},
	{Tree: "rdt/internal/claims", MustNot: without(rdtEngines, "rdt/internal/claims"),
		Why: "device claims are lock files, nothing of the runtime"},
	{Tree: "rdt/internal/observe", MustNot: without(rdtEngines, "rdt/internal/observe"),
		Why: "the observer records what rdt tells it about a transfer, and knows nothing of how it moved"},
	{Tree: "rdt/internal/life", MustNot: without(rdtEngines, "rdt/internal/life"),
		Why: "the lifecycle protocol's transport hands each request to the runtime through a callback; what a lease does is objstore's, rdt wires them"},
	{Tree: "rdt/internal/pushrun", MustNot: without(rdtEngines, "rdt/internal/pushrun"),
		Why: "the push engine reaches its runtime (pins, the planner, notices) through Env only"},
	{Tree: "rdt/internal/reader", MustNot: without(rdtEngines, "rdt/internal/reader", "rdt/internal/leases", "rdt/internal/peers", "rdt/internal/objstore"),
		Why: "the read side reaches its runtime (leases over the control channel, memory, the planner) through Env and Planner, takes leases in leases' table, knows liveness through Peers (peers.Table) and layouts by objstore's sum"},
	{Tree: "rdt/internal/devset", MustNot: without(rdtEngines, "rdt/internal/devset"),
		Why: "a runtime's devices are memories opened through tensor/backend, nothing of the runtime's protocols"},
	{Tree: "rdt/internal/ctlhost", MustNot: without(rdtEngines, "rdt/internal/ctlhost"),
		Why: "the control plane's libp2p host knows peers and addresses, not the protocols that run on it"},
	{Tree: "sched", MustNot: []string{"fabric", "rdt", "bench", "dashboard"},
		Why: "placement is a pure function of topology, request and state"},
	{Tree: "internal", MustNot: []string{"fabric", "rdt", "sched", "bench", "dashboard"},
		Why: "codecs, copies, wire formats and test harnesses are leaves the layers share"},
	{Tree: "cmd/internal/capi", MustNot: []string{"sched", "bench", "dashboard"},
		Why: "the C ABI's Go side is a shell over rdt for cmd/libtensorlane, as cmd/tensorlane is for the CLI"},
	{Tree: "cmd/internal/demo", MustNot: []string{"sched", "dashboard"},
		Why: "the demo engine of cmd/tensorlane runs runtimes through rdt against bench's memcpy baseline; the dashboard uses it, not the other way"},
	{Tree: "cmd/internal/envinfo", MustNot: []string{"rdt", "sched", "bench", "dashboard"},
		Why: "the env report reads the machine and asks the CUDA driver and the rdma providers; it runs no runtime"},
	{Tree: "cmd/internal/soak", MustNot: []string{"sched", "bench", "dashboard"},
		Why: "the soak engine of cmd/tensorlane drives runtimes through rdt; the command only parses flags and prints"},
	{Tree: "cmd/internal/worker", MustNot: []string{"sched", "bench", "dashboard"},
		Why: "the worker engine of cmd/tensorlane serves one runtime through rdt; the command only parses flags"},
	{Tree: "dashboard", MustNot: []string{"bench"},
		Why: "the dashboard shows a running runtime, not benchmark runs"},
	{Tree: "fabricsim", MustNot: []string{"fabric/local", "fabric/shm", "fabric/rdma", "fabric/tcp", "fabric/linkstat", "fabric/stack", "sched", "bench", "dashboard"},
		Why: "the simulator runs tensorlane's plans (the planner, rdt's broadcast tree) against simulated links, never a transport"},
}

// rdtEngines are rdt's machinery behind its front, each a seam of its own:
// none imports another (rdt wires them together), and the wire vocabulary
// below them (errs, ctlwire, refwire, bcast) imports none of them.
var rdtEngines = []string{"rdt/internal/objstore", "rdt/internal/bcastrun", "rdt/internal/peers", "rdt/internal/leases",
	"rdt/internal/notices", "rdt/internal/ctlmsg", "rdt/internal/claims", "rdt/internal/faults", "rdt/internal/observe", "rdt/internal/life", "rdt/internal/pushrun", "rdt/internal/ctlhost",
	"rdt/internal/reader", "rdt/internal/devset"}

// without is list less drop.
func without(list []string, drop ...string) []string {
	var out []string
	for _, s := range list {
		if !slices.Contains(drop, s) {
			out = append(out, s)
		}
	}
	return out
}

// TestOnly says whether p is made for _test.go files, so that no package
// but another such helper may import it: its name ends in "test"
// (fabrictest, rdttest, topotest, cudatest, ...) or is testhelp, it lies
// below such a package, or its own files import "testing". Code that a
// program needs lives elsewhere (topology/topocheck beside topotest).
func TestOnly(p Package) bool {
	if p.Testing {
		return true
	}
	for e := range strings.SplitSeq(p.Path, "/") {
		if strings.HasSuffix(e, "test") || e == "testhelp" {
			return true
		}
	}
	return false
}

// Package is what Check needs to know of one package.
type Package struct {
	Path    string   // relative to Module
	Imports []string // the module's packages it imports
	Doc     string
	Testing bool // its non-test files import "testing"
}

// under reports whether pkg is tree or below it.
func under(pkg, tree string) bool {
	return pkg == tree || strings.HasPrefix(pkg, tree+"/")
}

// Check returns one line for every broken rule, sorted.
func Check(pkgs []Package) []string {
	var out []string
	byPath := map[string]Package{}
	for _, p := range pkgs {
		byPath[p.Path] = p
	}
	for _, p := range pkgs {
		if p.Doc == "" {
			out = append(out, fmt.Sprintf("%s has no package doc comment", p.Path))
		}
		for _, r := range Rules {
			if !under(p.Path, r.Tree) || slices.ContainsFunc(r.Except, func(e string) bool { return under(p.Path, e) }) {
				continue
			}
			for _, imp := range p.Imports {
				for _, bad := range r.MustNot {
					if under(imp, bad) {
						out = append(out, fmt.Sprintf("%s imports %s: %s must not import %s (%s)", p.Path, imp, r.Tree, bad, r.Why))
					}
				}
			}
		}
		// A test helper may build on another (fabric/rdma/internal/provtest
		// on fabric/fabrictest): both only ever reach _test.go files.
		if TestOnly(p) {
			continue
		}
		for _, imp := range p.Imports {
			if h, ok := byPath[imp]; ok && TestOnly(h) || !ok && TestOnly(Package{Path: imp}) {
				out = append(out, fmt.Sprintf("%s imports %s, a helper for tests only", p.Path, imp))
			}
		}
	}
	slices.Sort(out)
	return out
}
