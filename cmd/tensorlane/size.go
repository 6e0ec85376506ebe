package main

import "fmt"

// parseSize reads a size flag: "64MiB", "1.5GiB", "4096". The result is
// rounded down to whole 8-byte words, so the verification patterns cover
// every byte.
func parseSize(s string) (int64, error) {
	var n float64
	var unit string
	if _, err := fmt.Sscanf(s, "%g%s", &n, &unit); err != nil {
		if _, err2 := fmt.Sscanf(s, "%g", &n); err2 != nil {
			return 0, fmt.Errorf("bad size %q", s)
		}
	}
	mult := map[string]float64{"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
	if mult == 0 || n <= 0 {
		return 0, fmt.Errorf("bad size %q (use e.g. 64MiB)", s)
	}
	v := int64(n * mult)
	return v / 8 * 8, nil // whole 8-byte words, so the pattern covers every byte
}

// parseWordSize is parseSize for a size the engines read as "default" when
// zero: a size below one 8-byte word is refused rather than silently
// replaced by the default.
func parseWordSize(s string) (int64, error) {
	n, err := parseSize(s)
	if err == nil && n == 0 {
		err = fmt.Errorf("bad size %q: less than one 8-byte word", s)
	}
	return n, err
}
