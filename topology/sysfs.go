package topology

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// maxAttrBytes bounds what one sysfs attribute read returns; real
// attributes are a page at most.
const maxAttrBytes = 64 << 10

// maxLinkHops bounds symbolic-link resolution, like the kernel's 40.
const maxLinkHops = 40

// ErrSymlinkLoop is reported (inside a Warning or an error) when a path
// cannot be resolved because its links loop or nest too deeply.
var ErrSymlinkLoop = errors.New("topology: too many levels of symbolic links")

// FS reads a Linux system tree (sys/, dev/, proc/, etc/) under a root
// directory. Paths given to its methods are slash-separated and relative to
// the root ("sys/bus/pci/devices"); absolute link targets are taken
// relative to the root too, so a copied tree behaves like the live one.
type FS struct {
	root string
	// sysfsOnly: root is a sysfs; "sys/x" is root/x and "dev/x" is
	// root/../dev/x.
	sysfsOnly bool
}

// NewFS returns an FS rooted at dir ("" or "/" for the live system).
func NewFS(dir string) FS {
	if dir == "" {
		dir = "/"
	}
	return FS{root: filepath.Clean(dir)}
}

// Root returns the root directory.
func (f FS) Root() string { return f.root }

func (f FS) abs(rel string) string {
	rel = strings.TrimPrefix(rel, "/")
	if f.sysfsOnly {
		if rel == "sys" || strings.HasPrefix(rel, "sys/") {
			return filepath.Join(f.root, filepath.FromSlash(rel[3:]))
		}
		return filepath.Join(filepath.Dir(f.root), filepath.FromSlash(rel))
	}
	return filepath.Join(f.root, filepath.FromSlash(rel))
}

// readAttrFile reads a small file by its own path, outside any FS.
func readAttrFile(name string) (string, error) {
	return FS{root: filepath.Dir(name)}.ReadAttr(filepath.Base(name))
}

// Exists reports whether the path exists (links followed).
func (f FS) Exists(rel string) bool {
	_, err := os.Stat(f.abs(rel))
	return err == nil
}

// ReadAttr reads a small text file and trims surrounding white space.
func (f FS) ReadAttr(rel string) (string, error) {
	fh, err := os.Open(f.abs(rel))
	if err != nil {
		return "", err
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, maxAttrBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxAttrBytes {
		return "", fmt.Errorf("larger than %d bytes", maxAttrBytes)
	}
	return strings.TrimSpace(string(b)), nil
}

// ReadInt reads a decimal (or 0x-prefixed hexadecimal) integer attribute.
func (f FS) ReadInt(rel string) (int64, error) {
	s, err := f.ReadAttr(rel)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(s, 0, 64)
}

// ReadHex reads a hexadecimal attribute with or without its 0x prefix.
func (f FS) ReadHex(rel string) (uint64, error) {
	s, err := f.ReadAttr(rel)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimPrefix(strings.ToLower(s), "0x"), 16, 64)
}

// List returns the names in a directory, sorted; a missing directory gives
// nil and an error satisfying errors.Is(err, fs.ErrNotExist).
func (f FS) List(rel string) ([]string, error) {
	ents, err := os.ReadDir(f.abs(rel))
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names, nil
}

// Glob lists the names in dir that start with prefix, sorted naturally
// (accel2 before accel10).
func (f FS) Glob(dir, prefix string) []string {
	names, _ := f.List(dir)
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return naturalLess(out[i], out[j]) })
	return out
}

// ReadLink returns the target of a symbolic link.
func (f FS) ReadLink(rel string) (string, error) {
	return os.Readlink(f.abs(rel))
}

// Resolve returns the real path of rel below the root, following every
// symbolic link on the way, as a slash-separated path relative to the root.
// It fails with ErrSymlinkLoop after 40 links and never leaves the root.
func (f FS) Resolve(rel string) (string, error) { return f.resolve(rel, nil) }

// resolve is Resolve with a cache of paths known to be real directories or
// files (not links), shared by the lookups of one discovery.
func (f FS) resolve(rel string, known map[string]bool) (string, error) {
	pending := splitPath(rel)
	var done []string
	hops := 0
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case ".", "":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		cur := path.Join(append(append([]string{}, done...), c)...)
		if known[cur] {
			done = append(done, c)
			continue
		}
		fi, err := os.Lstat(f.abs(cur))
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			if known != nil {
				known[cur] = true
			}
			done = append(done, c)
			continue
		}
		hops++
		if hops > maxLinkHops {
			return "", fmt.Errorf("%s: %w", rel, ErrSymlinkLoop)
		}
		target, err := os.Readlink(f.abs(cur))
		if err != nil {
			return "", err
		}
		target = filepath.ToSlash(target)
		if strings.HasPrefix(target, "/") {
			done = nil
		}
		pending = append(splitPath(target), pending...)
	}
	return path.Join(done...), nil
}

func splitPath(p string) []string {
	return strings.Split(strings.Trim(filepath.ToSlash(p), "/"), "/")
}

// naturalLess orders strings with embedded numbers by value.
func naturalLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := digitPrefix(a), digitPrefix(b)
		if da != "" && db != "" {
			if len(strings.TrimLeft(da, "0")) != len(strings.TrimLeft(db, "0")) {
				return len(strings.TrimLeft(da, "0")) < len(strings.TrimLeft(db, "0"))
			}
			if da != db {
				return strings.TrimLeft(da, "0") < strings.TrimLeft(db, "0")
			}
			a, b = a[len(da):], b[len(db):]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func digitPrefix(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}

// ParseCPUList parses a Linux cpulist ("0-3,8,10-11") into CPU numbers.
// It rejects lists of more than 1<<16 CPUs.
func ParseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(strings.TrimSpace(lo))
		if err != nil || a < 0 {
			return nil, fmt.Errorf("cpulist %q: bad entry %q", s, part)
		}
		b := a
		if isRange {
			b, err = strconv.Atoi(strings.TrimSpace(hi))
			if err != nil || b < a {
				return nil, fmt.Errorf("cpulist %q: bad range %q", s, part)
			}
		}
		if b-a+len(out) >= 1<<16 {
			return nil, fmt.Errorf("cpulist %q: too many CPUs", s)
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return out, nil
}
