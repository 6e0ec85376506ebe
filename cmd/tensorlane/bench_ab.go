package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tensorlane/tensorlane/bench/ab"
	"github.com/tensorlane/tensorlane/bench/harness"
)

// abOptions are bench's A/B flags (bench/ab).
type abOptions struct {
	base, head       string
	baseEnv, headEnv []string
	repo, cache      string
	reps             int
	alpha, threshold float64
	metric, mode     string
	rounds           int
	quantile         float64
	serve            string
	cells            []string
	jsonOut          string
}

func (o *abOptions) flags(f *pflag.FlagSet) {
	f.StringVar(&o.base, "base", "", "A/B: compare against this build (a tensorlane executable or a git revision, built once into --ab-cache)")
	f.StringVar(&o.head, "head", "", "A/B: the build under test (executable or git revision; default this binary)")
	f.StringArrayVar(&o.baseEnv, "base-env", nil, "A/B: KEY=VALUE for the base build's runs (repeatable)")
	f.StringArrayVar(&o.headEnv, "head-env", nil, "A/B: KEY=VALUE for the head build's runs (repeatable; e.g. "+harness.SlowdownEnv+"=shm=0.10)")
	f.StringVar(&o.repo, "repo", ".", "A/B: the git repository revisions are taken from")
	f.StringVar(&o.cache, "ab-cache", "", "A/B: where built revisions are kept (default the user cache dir)")
	f.IntVar(&o.reps, "reps", 0, "A/B: interleaved pairs per cell (default 40)")
	f.Float64Var(&o.alpha, "alpha", 0, "A/B: false-alarm rate over the whole matrix (default 0.05)")
	f.Float64Var(&o.threshold, "threshold", 0, "A/B: least slip a verdict names (default 0.03)")
	f.StringVar(&o.metric, "metric", "", "A/B: wall (default) or cpu; with --ab-mode process: ratio (default), gbps, median-gbps or best-gbps")
	f.StringVar(&o.mode, "ab-mode", "", "A/B: serve (default: one process per build holds the cell, rounds alternate) or process (a bench run per sample, for a base older than --ab-serve)")
	f.IntVar(&o.rounds, "ab-rounds", 0, "A/B: rounds of each build per sample, in serve mode (default 31)")
	f.Float64Var(&o.quantile, "ab-quantile", 0, "A/B: the quantile of a sample's round rates taken as the sample, in serve mode (default 0.5; 1: the fastest round)")
	f.StringVar(&o.serve, "ab-serve", "", "internal: serve one cell (path/mode/size/cN) to the A/B guard on stdin/stdout")
	_ = f.MarkHidden("ab-serve")
	f.StringSliceVar(&o.cells, "cells", nil, "A/B: cells as path/mode/size/cN (default the quick A/B matrix, e.g. shm/pull/1MiB/c1)")
	f.StringVar(&o.jsonOut, "ab-json", "", "A/B: also write the report as JSON to this file")
}

// runAB runs "bench --base A [--head B]" and fails naming each regressed
// cell.
func runAB(cmd *cobra.Command, o benchOptions) error {
	a := o.ab
	ctx := cmd.Context()
	cache := a.cache
	if cache == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			d = os.TempDir()
		}
		cache = filepath.Join(d, "tensorlane", "ab")
	}
	if a.base == "" {
		return fmt.Errorf("%w: --head needs --base (the build to compare it with)", ab.ErrBadConfig)
	}
	base, err := ab.Resolve(ctx, a.base, a.repo, cache)
	if err != nil {
		return err
	}
	var head ab.Build
	if a.head == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench --head: this binary: %w", err)
		}
		head = ab.Build{Name: "this binary", Exe: exe}
	} else if head, err = ab.Resolve(ctx, a.head, a.repo, cache); err != nil {
		return err
	}
	for _, kv := range append(append([]string{}, a.baseEnv...), a.headEnv...) {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("%w: %q is not KEY=VALUE", ab.ErrBadConfig, kv)
		}
	}
	base.Env, head.Env = a.baseEnv, a.headEnv
	if len(a.headEnv) > 0 {
		head.Name += " with " + strings.Join(a.headEnv, " ")
	}
	if len(a.baseEnv) > 0 {
		base.Name += " with " + strings.Join(a.baseEnv, " ")
	}
	cfg := ab.Config{Base: base, Head: head, Reps: a.reps, Alpha: a.alpha, Threshold: a.threshold, Metric: a.metric,
		Mode: a.mode, Rounds: a.rounds, Quantile: a.quantile,
		MinTime: o.minTime, MinRounds: o.minRounds, Progress: cmd.ErrOrStderr()}
	for _, s := range a.cells {
		c, err := parseCell(s)
		if err != nil {
			return err
		}
		cfg.Cells = append(cfg.Cells, c)
	}
	rep, err := ab.Run(ctx, cfg)
	if err != nil {
		return err
	}
	rep.Write(cmd.OutOrStdout())
	if a.jsonOut != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(a.jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return rep.Err()
}

// runABServe is the child half of the A/B guard (harness.Serve).
func runABServe(cmd *cobra.Command, o benchOptions) error {
	c, err := parseCell(o.ab.serve)
	if err != nil {
		return err
	}
	return harness.Serve(cmd.Context(), harness.Config{}, c.Path, c.Mode, c.Size, c.Concurrency, cmd.InOrStdin(), cmd.OutOrStdout())
}

// parseCell reads "path/mode/size/cN".
func parseCell(s string) (ab.Cell, error) {
	p := strings.Split(s, "/")
	if len(p) != 4 || (p[1] != harness.ModePull && p[1] != harness.ModePush) || !strings.HasPrefix(p[3], "c") {
		return ab.Cell{}, fmt.Errorf("%w: cell %q is not path/pull|push/size/cN", ab.ErrBadConfig, s)
	}
	size, err := parseSize(p[2])
	if err != nil {
		return ab.Cell{}, err
	}
	var c int
	if _, err := fmt.Sscanf(p[3], "c%d", &c); err != nil || c < 1 {
		return ab.Cell{}, fmt.Errorf("%w: cell %q: concurrency %q", ab.ErrBadConfig, s, p[3])
	}
	return ab.Cell{Path: p[0], Mode: p[1], Size: size, Concurrency: c}, nil
}
