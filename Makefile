# Test tiers. Each tier runs the one before it, one step at a time through
# scripts/tier-step.sh (its output in $(RESULTS)/<step>.log, its status and
# seconds in $(RESULTS)/steps.tsv), goes on past a failed step, and ends with
# tensorlane tier-record: $(RESULTS)/summary.json (steps, figures, the
# machine's env), a line in testdata/tiers/<tier>.jsonl (the history, kept in
# the repository) and $(RESULTS)/history.png (every figure over that history).
# See docs/ci.md.
#   make pr       what CI runs on every submission (.ci/run)
#   make nightly  pr + the A/B guard against the last release tag, the full
#                 bench with plots, Go benchmarks, a $(SOAK) soak, the whole
#                 multi-host fault matrix, the multi-node Ray cases, the Ray
#                 benchmark
#   make release  nightly + a $(LONG_SOAK) soak, every fuzz target for
#                 $(FUZZTIME), the conformance levels of every plug-in point
RESULTS   ?= results/$(shell date -u +%Y%m%dT%H%M%SZ)
SOAK      ?= 10m
LONG_SOAK ?= 1h
FUZZTIME  ?= 30s
GO        ?= go
PY        ?= .venv/bin/python

STEP   = scripts/tier-step.sh $(RESULTS)
TL     = $(RESULTS)/tensorlane
RECORD = $(GO) run ./cmd/tensorlane tier-record --results $(RESULTS)

# Each list is shell: steps that each add "|| rc=1;" so the tier goes on.
PR_STEPS = \
	$(STEP) ci bash .ci/run || rc=1; \
	$(GO) run ./cmd/tensorlane env --json > $(RESULTS)/env.json || rc=1;

NIGHTLY_STEPS = $(PR_STEPS) \
	$(STEP) build $(GO) build -o $(TL) ./cmd/tensorlane || rc=1; \
	$(STEP) ab-release scripts/ab-release.sh $(TL) $(RESULTS) || rc=1; \
	$(STEP) bench $(TL) bench --out $(RESULTS)/bench || rc=1; \
	$(STEP) gobench $(GO) test -run '^$$' -bench . -benchtime 5x -count 3 ./fabric/... ./rdt/ || rc=1; \
	$(STEP) soak sh -c '$(TL) soak --duration $(SOAK) --json > $(RESULTS)/soak.json' || rc=1; \
	$(STEP) multihost env TENSORLANE_FAULT_MATRIX=full $(GO) test -count=1 -v ./internal/multihost/ || rc=1; \
	$(STEP) ray-multinode sh -c '$(PY) -m pytest -q -p no:cacheprovider -m multinode python/tests; rc=$$?; [ $$rc -ne 5 ] || { echo "no multi-node Ray cases yet (pytest -m multinode)"; exit 3; }; exit $$rc' || rc=1; \
	$(STEP) ray-bench $(PY) bench/ray/bench.py --json $(RESULTS)/ray-bench.json || rc=1;

RELEASE_STEPS = $(NIGHTLY_STEPS) \
	$(STEP) long-soak sh -c '$(TL) soak --duration $(LONG_SOAK) --json > $(RESULTS)/long-soak.json' || rc=1; \
	$(STEP) fuzz scripts/fuzz-all.sh $(FUZZTIME) || rc=1; \
	$(STEP) conformance sh -c '$(TL) conformance --json > $(RESULTS)/plugins.json' || rc=1; \
	$(STEP) transports $(GO) test -count=1 -v -run Conformance ./fabric/... || rc=1;

.PHONY: pr nightly release bench-baseline

pr:
	@mkdir -p $(RESULTS); rc=0; $(PR_STEPS) $(RECORD) --tier pr || rc=1; exit $$rc

nightly:
	@mkdir -p $(RESULTS); rc=0; $(NIGHTLY_STEPS) $(RECORD) --tier nightly || rc=1; exit $$rc

release:
	@mkdir -p $(RESULTS); rc=0; $(RELEASE_STEPS) $(RECORD) --tier release || rc=1; exit $$rc

# Refresh the bench guard's stored ratios (see docs/benchmarks.md).
bench-baseline:
	$(GO) run ./cmd/tensorlane bench --quick --write-baseline testdata/bench-baseline.json
