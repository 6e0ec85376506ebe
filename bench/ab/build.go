package ab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Resolve turns spec into a build: an executable file as it is, anything
// else a git revision of the repository at repo, exported (git archive) and
// built with go into cacheDir/<commit>/tensorlane once; later calls reuse
// that binary. The export leaves the repository's worktrees and index alone.
func Resolve(ctx context.Context, spec, repo, cacheDir string) (Build, error) {
	if spec == "" {
		return Build{}, fmt.Errorf("%w: empty build", ErrBadConfig)
	}
	if st, err := os.Stat(spec); err == nil && !st.IsDir() {
		if st.Mode()&0o111 == 0 {
			return Build{}, fmt.Errorf("%w: %s is not executable", ErrBadConfig, spec)
		}
		abs, err := filepath.Abs(spec)
		if err != nil {
			return Build{}, err
		}
		return Build{Name: spec, Exe: abs}, nil
	}
	// A cold build of the whole command on a loaded 2-core machine took
	// over 10 minutes with -trimpath (nothing shared with the build cache).
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	commit, err := git(ctx, repo, "rev-parse", "--verify", "--quiet", spec+"^{commit}")
	if err != nil {
		return Build{}, fmt.Errorf("%w: %q is neither an executable nor a git revision of %s", ErrBadConfig, spec, repo)
	}
	dir := filepath.Join(cacheDir, commit)
	exe := filepath.Join(dir, "tensorlane")
	name := spec + " (" + commit[:12] + ")"
	if _, err := os.Stat(exe); err == nil {
		return Build{Name: name, Exe: exe}, nil
	}
	src, err := os.MkdirTemp(cacheDir, "src-")
	if err != nil {
		if err = os.MkdirAll(cacheDir, 0o755); err == nil {
			src, err = os.MkdirTemp(cacheDir, "src-")
		}
		if err != nil {
			return Build{}, err
		}
	}
	defer os.RemoveAll(src)
	archive := exec.CommandContext(ctx, "git", "-C", repo, "archive", "--format=tar", commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return Build{}, err
	}
	untar.Stdin = pipe
	var errb bytes.Buffer
	archive.Stderr, untar.Stderr = &errb, &errb
	if err := untar.Start(); err != nil {
		return Build{}, err
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return Build{}, fmt.Errorf("git archive %s: %w: %s", commit, err, errb.String())
	}
	if err := untar.Wait(); err != nil {
		return Build{}, fmt.Errorf("untar %s: %w: %s", commit, err, errb.String())
	}
	tmp := filepath.Join(src, "tensorlane.bin")
	build := exec.CommandContext(ctx, "go", "build", "-buildvcs=false", "-o", tmp, "./cmd/tensorlane")
	build.Dir = src
	build.Stderr = &errb
	if err := build.Run(); err != nil {
		return Build{}, fmt.Errorf("%w: go build of %s: %w: %s", ErrBadConfig, name, err, errb.String())
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Build{}, err
	}
	// Rename last, so a half-built binary is never taken from the cache.
	if err := os.Rename(tmp, exe); err != nil {
		return Build{}, err
	}
	return Build{Name: name, Exe: exe}, nil
}

// LastReleaseTag is the newest v* tag reachable from HEAD in repo, or ""
// when there is none yet.
func LastReleaseTag(ctx context.Context, repo string) string {
	t, err := git(ctx, repo, "describe", "--tags", "--abbrev=0", "--match", "v*")
	if err != nil {
		return ""
	}
	return t
}

func git(ctx context.Context, repo string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", repo}, args...)...)
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}
