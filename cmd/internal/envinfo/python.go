package envinfo

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// PythonEnv is the Python environment the tests use, read from its files
// (pyvenv.cfg and the *.dist-info directories of site-packages), so that
// no interpreter is run and a broken environment is still described.
type PythonEnv struct {
	// Prefix is the environment's directory (a venv).
	Prefix  string `json:"prefix"`
	Version string `json:"version,omitempty"`
	// Key holds the packages a report names (ray, numpy, torch,
	// ml_dtypes): a version, or "absent".
	Key map[string]string `json:"key"`
	// Packages is every installed distribution: normalized name -> version.
	Packages map[string]string `json:"packages"`
}

// KeyPackages are the Python packages tensorlane's Python side depends on
// or is measured against, named in every report.
var KeyPackages = []string{"ray", "numpy", "torch", "ml-dtypes"}

// PythonPrefix picks the environment to describe: $TENSORLANE_PYTHON_ENV,
// else $VIRTUAL_ENV, else .venv under dir (the one .ci/run fills).
func PythonPrefix(dir string) string {
	for _, p := range []string{os.Getenv("TENSORLANE_PYTHON_ENV"), os.Getenv("VIRTUAL_ENV")} {
		if p != "" {
			return p
		}
	}
	return filepath.Join(dir, ".venv")
}

// ReadPython describes the environment at prefix, or returns nil when
// there is none.
func ReadPython(prefix string) *PythonEnv {
	cfg, err := os.ReadFile(filepath.Join(prefix, "pyvenv.cfg"))
	sites, _ := filepath.Glob(filepath.Join(prefix, "lib", "python3*", "site-packages"))
	if err != nil && len(sites) == 0 {
		return nil
	}
	p := &PythonEnv{Prefix: prefix, Key: map[string]string{}, Packages: map[string]string{}}
	for _, line := range strings.Split(string(cfg), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if k = strings.TrimSpace(k); ok && (k == "version" || k == "version_info") {
			p.Version = strings.TrimSpace(v)
		}
	}
	for _, site := range sites {
		infos, _ := filepath.Glob(filepath.Join(site, "*.dist-info"))
		for _, d := range infos {
			name, ver, ok := distInfo(filepath.Base(d))
			if ok {
				p.Packages[name] = ver
			}
		}
	}
	for _, k := range KeyPackages {
		if v, ok := p.Packages[k]; ok {
			p.Key[k] = v
		} else {
			p.Key[k] = "absent"
		}
	}
	return p
}

// distInfo reads "ml_dtypes-0.7.0.dist-info" as ("ml-dtypes", "0.7.0").
func distInfo(base string) (name, version string, ok bool) {
	s, ok := strings.CutSuffix(base, ".dist-info")
	if !ok {
		return "", "", false
	}
	i := strings.Index(s, "-")
	if i <= 0 {
		return "", "", false
	}
	return NormalizeName(s[:i]), s[i+1:], true
}

var nameSep = regexp.MustCompile(`[-_.]+`)

// NormalizeName is PEP 503's normalized form of a distribution name.
func NormalizeName(n string) string { return nameSep.ReplaceAllString(strings.ToLower(n), "-") }

func sortedNames(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
