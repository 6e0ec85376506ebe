package archtest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tagSets are the build configurations the rules are checked under: the
// default build and every opt-in tag at once (ofi, nvml, gpu), so files
// behind a tag do not escape the rules. Files behind a negated tag
// (!ofi) are only in the first.
var tagSets = []string{"", "ofi,nvml,gpu"}

// listModule runs go list over the whole module under every tag set and
// merges what each package imports.
func listModule(t *testing.T) []Package {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}").Output()
	require.NoError(t, err, "go list -m")
	byPath := map[string]*Package{}
	var order []string
	for _, tags := range tagSets {
		cmd := exec.CommandContext(ctx, "go", "list", "-tags", tags, "-json=ImportPath,Imports,Doc", "./...")
		cmd.Dir = strings.TrimSpace(string(root))
		out, err := cmd.Output()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list -tags %q ./...: %v\n%s", tags, err, ee.Stderr)
		}
		require.NoError(t, err)
		dec := json.NewDecoder(strings.NewReader(string(out)))
		for {
			var p struct {
				ImportPath, Doc string
				Imports         []string
			}
			if err := dec.Decode(&p); err == io.EOF {
				break
			} else {
				require.NoError(t, err)
			}
			path := rel(p.ImportPath)
			pkg, ok := byPath[path]
			if !ok {
				pkg = &Package{Path: path, Doc: p.Doc}
				byPath[path] = pkg
				order = append(order, path)
			}
			for _, imp := range p.Imports {
				pkg.Testing = pkg.Testing || imp == "testing"
				if strings.HasPrefix(imp, Module+"/") && !slices.Contains(pkg.Imports, rel(imp)) {
					pkg.Imports = append(pkg.Imports, rel(imp))
				}
			}
		}
	}
	pkgs := make([]Package, 0, len(order))
	for _, p := range order {
		pkgs = append(pkgs, *byPath[p])
	}
	return pkgs
}

func rel(path string) string { return strings.TrimPrefix(path, Module+"/") }

// TestImportRules is the check itself: the module as it stands keeps every
// rule.
func TestImportRules(t *testing.T) {
	pkgs := listModule(t)
	require.Greater(t, len(pkgs), 10, "go list found too few packages")
	for _, tree := range []string{"tensor", "topology", "fabric", "rdt", "sched", "internal/tcodec"} {
		assert.True(t, containsPath(pkgs, tree), "go list did not list %s", tree)
	}
	for _, v := range Check(pkgs) {
		t.Error(v)
	}
}

func containsPath(pkgs []Package, path string) bool {
	for _, p := range pkgs {
		if p.Path == path {
			return true
		}
	}
	return false
}

// TestCheck shows that each kind of breach is caught, on made-up modules.
func TestCheck(t *testing.T) {
	const doc = "Package x."
	for _, c := range []struct {
		name string
		pkgs []Package
		want []string
	}{
		{"clean", []Package{
			{Path: "tensor", Doc: doc},
			{Path: "fabric/tcp", Imports: []string{"fabric", "internal/tcodec", "tensor", "topology"}, Doc: doc},
			{Path: "rdt", Imports: []string{"fabric", "fabric/stack"}, Doc: doc},
			{Path: "fabric/stack", Imports: []string{"fabric", "fabric/tcp", "fabric/rdma/softrdma"}, Doc: doc},
			{Path: "rdt/placement", Imports: []string{"rdt", "sched"}, Doc: doc},
		}, nil},
		{"codec imports fabric (the old tcodec)", []Package{
			{Path: "internal/tcodec", Imports: []string{"fabric", "tensor"}, Doc: doc},
		}, []string{"internal/tcodec imports fabric: internal must not import fabric"}},
		{"fabric sub-package imports rdt", []Package{
			{Path: "fabric/shm", Imports: []string{"rdt"}, Doc: doc},
		}, []string{"fabric/shm imports rdt: fabric must not import rdt"}},
		{"the C ABI's Go side sits above rdt", []Package{
			{Path: "cmd/internal/capi", Imports: []string{"fabric", "rdt"}, Doc: doc},
			{Path: "cmd/internal/capi/x", Imports: []string{"dashboard"}, Doc: doc},
		}, []string{"cmd/internal/capi/x imports dashboard: cmd/internal/capi must not import dashboard"}},
		{"sched imports a transport", []Package{
			{Path: "sched", Imports: []string{"fabric/tcp"}, Doc: doc},
		}, []string{"sched imports fabric/tcp: sched must not import fabric"}},
		{"rdt imports a transport instead of fabric/stack", []Package{
			{Path: "rdt", Imports: []string{"fabric", "fabric/stack", "fabric/tcp"}, Doc: doc},
			{Path: "rdt/x", Imports: []string{"fabric/rdma/softrdma", "fabric/linkstat"}, Doc: doc},
		}, []string{
			"rdt imports fabric/tcp: rdt must not import fabric/tcp",
			"rdt/x imports fabric/linkstat: rdt must not import fabric/linkstat",
			"rdt/x imports fabric/rdma/softrdma: rdt must not import fabric/rdma",
		}},
		{"rdt's internal machinery reaches for the stack", []Package{
			{Path: "rdt", Imports: []string{"fabric/stack", "rdt/internal/bcast"}, Doc: doc},
			{Path: "rdt/internal/bcast", Imports: []string{"fabric", "fabric/stack"}, Doc: doc},
		}, []string{"rdt/internal/bcast imports fabric/stack: rdt/internal must not import fabric/stack"}},
		{"rdt imports sched outside rdt/placement", []Package{
			{Path: "rdt", Imports: []string{"sched"}, Doc: doc},
		}, []string{"rdt imports sched: rdt must not import sched"}},
		{"a prefix is not a parent", []Package{
			{Path: "tensorx", Imports: []string{"rdt"}, Doc: doc},
			{Path: "tensor", Imports: []string{"rdtx"}, Doc: doc},
		}, nil},
		{"test helper in library code", []Package{
			{Path: "dashboard", Imports: []string{"internal/testhelp"}, Doc: doc},
			{Path: "internal/testhelp", Doc: doc},
		}, []string{"dashboard imports internal/testhelp, a helper for tests only"}},
		{"a program links a *test package (the conformance command and topotest)", []Package{
			{Path: "cmd/tensorlane", Imports: []string{"topology/topotest", "topology/topocheck"}, Doc: doc},
			{Path: "topology/topocheck", Imports: []string{"topology"}, Doc: doc},
			{Path: "topology/topotest", Imports: []string{"topology", "topology/topocheck"}, Doc: doc, Testing: true},
		}, []string{"cmd/tensorlane imports topology/topotest, a helper for tests only"}},
		{"a package that imports testing is a test helper, whatever its name", []Package{
			{Path: "conformance", Imports: []string{"internal/netns"}, Doc: doc},
			{Path: "internal/netns", Doc: doc, Testing: true},
		}, []string{"conformance imports internal/netns, a helper for tests only"}},
		{"helpers build on helpers (below testhelp is a helper too); a name that only contains test is not one", []Package{
			{Path: "fabric/rdma/internal/provtest", Imports: []string{"fabric/fabrictest"}, Doc: doc, Testing: true},
			{Path: "fabric/fabrictest", Doc: doc, Testing: true},
			{Path: "internal/testhelp/caps", Imports: []string{"internal/testhelp"}, Doc: doc},
			{Path: "rdt", Imports: []string{"fabric/fabrictestdata"}, Doc: doc},
		}, nil},
		{"no doc comment", []Package{{Path: "fabric/new"}}, []string{"fabric/new has no package doc comment"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Check(c.pkgs)
			require.Len(t, got, len(c.want), "%q", got)
			for i := range got {
				assert.True(t, strings.HasPrefix(got[i], c.want[i]), "got %q, want it to begin %q", got[i], c.want[i])
			}
		})
	}
}

// TestProgramsLinkNoTestCode: the command and the C library link neither
// the testing package nor a test helper, under every tag set (the
// conformance command used to link topology/topotest, and through
// internal/netns, testing).
func TestProgramsLinkNoTestCode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, tags := range tagSets {
		out, err := exec.CommandContext(ctx, "go", "list", "-tags", tags, "-deps", Module+"/cmd/tensorlane", Module+"/cmd/libtensorlane").Output()
		require.NoError(t, err, "go list -deps -tags %q", tags)
		for dep := range strings.Lines(string(out)) {
			dep = strings.TrimSpace(dep)
			if dep == "testing" || strings.HasPrefix(dep, Module+"/") && TestOnly(Package{Path: rel(dep)}) {
				t.Errorf("the programs link %s (tags %q)", dep, tags)
			}
		}
	}
}
