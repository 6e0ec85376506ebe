package readme

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// prelude declares what snippets use without declaring.
const prelude = `package readme

import (
	"context"
	"fmt"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

var (
	ctx             context.Context
	trainer, reader *rdt.Actor
	engine          *rdt.Actor
	rt              *rdt.Runtime
	w               tensor.Tensor
	ref, slotRef    rdt.Ref
	slotRefs        []rdt.Ref
	stateDict       []rdt.Ref

	_ = fmt.Sprint
	_ = topology.Preset
)
`

var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// snippets returns README.md's Go blocks.
func snippets(t *testing.T) []string {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	var out []string
	for _, m := range goBlock.FindAllSubmatch(b, -1) {
		out = append(out, string(m[1]))
	}
	return out
}

// program wraps each snippet in a function and marks its top-level
// declarations used.
func program(t *testing.T, snips []string) []byte {
	var src strings.Builder
	src.WriteString(prelude)
	for i, s := range snips {
		fmt.Fprintf(&src, "\nfunc snippet%d() {\n%s\n}\n", i, s)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "snippets.go", src.String(), parser.ParseComments)
	require.NoError(t, err, "a README Go snippet does not parse:\n%s", src.String())
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		var uses []ast.Stmt
		mark := func(id *ast.Ident) {
			if id.Name != "_" {
				uses = append(uses, &ast.AssignStmt{Lhs: []ast.Expr{ast.NewIdent("_")}, Tok: token.ASSIGN, Rhs: []ast.Expr{ast.NewIdent(id.Name)}})
			}
		}
		for _, st := range fn.Body.List {
			switch st := st.(type) {
			case *ast.AssignStmt:
				if st.Tok == token.DEFINE {
					for _, e := range st.Lhs {
						mark(e.(*ast.Ident))
					}
				}
			case *ast.DeclStmt:
				if g, ok := st.Decl.(*ast.GenDecl); ok {
					for _, sp := range g.Specs {
						if vs, ok := sp.(*ast.ValueSpec); ok {
							for _, id := range vs.Names {
								mark(id)
							}
						}
					}
				}
			}
		}
		fn.Body.List = append(fn.Body.List, uses...)
	}
	var out bytes.Buffer
	require.NoError(t, format.Node(&out, fset, f))
	return out.Bytes()
}

// TestREADMESnippetsCompile builds README.md's Go snippets with this
// package (go build -overlay: the module and build cache as they are).
func TestREADMESnippetsCompile(t *testing.T) {
	snips := snippets(t)
	require.NotEmpty(t, snips, "README.md has Go snippets")
	src := program(t, snips)
	dir := t.TempDir()
	gen := filepath.Join(dir, "snippets.go")
	require.NoError(t, os.WriteFile(gen, src, 0o644))
	here, err := filepath.Abs("snippets_gen.go")
	require.NoError(t, err)
	ov, _ := json.Marshal(map[string]map[string]string{"Replace": {here: gen}})
	overlay := filepath.Join(dir, "overlay.json")
	require.NoError(t, os.WriteFile(overlay, ov, 0o644))
	cmd := exec.Command("go", "build", "-overlay", overlay, "-o", os.DevNull, ".")
	out, err := cmd.CombinedOutput()
	if err != nil {
		var numbered strings.Builder
		for i, l := range strings.Split(string(src), "\n") {
			fmt.Fprintf(&numbered, "%4d  %s\n", i+1, l)
		}
		t.Fatalf("README.md's Go snippets do not compile:\n%s\nas compiled:\n%s", out, numbered.String())
	}
	t.Logf("%d README snippets compile", len(snips))
}
