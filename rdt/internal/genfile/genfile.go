// Package genfile is the step tensorlane's code generators share (errgen for
// the error kinds, confgen for the configuration schema): regenerate a set of
// files under the module root, report which ones are out of date, write them
// when asked, and splice a generated block between two marker lines of a
// hand-written file. The generators' tests call Regenerate without writing,
// so a stale table fails `go test`.
package genfile

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// File is one generated file: its path relative to the module root and the
// function that makes its content from the content it has now (nil when the
// file does not exist yet).
type File struct {
	Path string
	Gen  func(old []byte) ([]byte, error)
}

// Regenerate makes every file under root and returns the paths whose content
// changed; it writes them only when write is set.
func Regenerate(root string, write bool, files []File) (stale []string, err error) {
	for _, f := range files {
		p := filepath.Join(root, f.Path)
		old, err := os.ReadFile(p)
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		out, err := f.Gen(old)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path, err)
		}
		if bytes.Equal(old, out) {
			continue
		}
		stale = append(stale, f.Path)
		if write {
			if err := os.WriteFile(p, out, 0o644); err != nil {
				return nil, err
			}
		}
	}
	return stale, nil
}

// Splice returns old with everything from the line begin up to (not
// including) the line end replaced by begin, a newline and body.
func Splice(old []byte, begin, end, body string) ([]byte, error) {
	s := string(old)
	a, b := strings.Index(s, begin), strings.Index(s, end)
	if a < 0 || b < a {
		return nil, fmt.Errorf("markers %q and %q not found", begin, end)
	}
	return []byte(s[:a] + begin + "\n" + body + s[b:]), nil
}

// Main is a generator's command line: -root names the module root (default
// "."), -check reports out-of-date files and exits 1 instead of writing
// them; hint says how to regenerate.
func Main(name, hint string, files func() []File) {
	check := flag.Bool("check", false, "report out-of-date files instead of writing them")
	root := flag.String("root", ".", "module root")
	flag.Parse()
	stale, err := Regenerate(*root, !*check, files())
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
	if *check && len(stale) > 0 {
		fmt.Fprintf(os.Stderr, "%s: out of date: %s (%s)\n", name, strings.Join(stale, ", "), hint)
		os.Exit(1)
	}
}
