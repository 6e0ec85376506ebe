package envinfo

import "testing"

func TestSelectedPolicy(t *testing.T) {
	for in, want := range map[string]string{
		"always within_size advise [never] deny force": "never",
		"[advise] never": "advise",
		"":               "",
		"madvise":        "madvise",
	} {
		if got := selected(in); got != want {
			t.Errorf("selected(%q) = %q, want %q", in, got, want)
		}
	}
}
