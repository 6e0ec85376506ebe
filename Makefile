# Test tiers. Each tier runs the one before it; results land in $(RESULTS).
#   make pr       what CI runs on every submission (.ci/run): vet, unit, integration,
#                 fault and conformance tests under -race, the quick bench guard
#   make nightly  pr + the full bench with plots, Go benchmarks, a 10-minute soak and
#                 the whole multi-host fault matrix
#   make release  nightly + conformance of every device plugin and transport, and the
#                 environment manifest of the machine it ran on, saved beside the results
RESULTS ?= results/$(shell date -u +%Y%m%dT%H%M%SZ)
SOAK    ?= 10m
GO      ?= go

.PHONY: pr nightly release bench-baseline

pr:
	bash .ci/run

nightly: pr
	mkdir -p $(RESULTS)
	$(GO) run ./cmd/tensorlane bench --out $(RESULTS)/bench
	$(GO) test -run '^$$' -bench . -benchtime 5x -count 3 ./fabric/... ./rdt/ | tee $(RESULTS)/gobench.txt
	$(GO) run ./cmd/tensorlane soak --duration $(SOAK) --json | tee $(RESULTS)/soak.json
	TENSORLANE_FAULT_MATRIX=full $(GO) test -count=1 -v ./internal/multihost/ | tee $(RESULTS)/multihost.txt

release: nightly
	$(GO) run ./cmd/tensorlane conformance --json > $(RESULTS)/plugins.json
	$(GO) test -count=1 -v -run Conformance ./fabric/... | tee $(RESULTS)/transports.txt
	$(GO) run ./cmd/tensorlane env --json > $(RESULTS)/env.json
	@echo "release results in $(RESULTS)"

# Refresh the bench guard's stored ratios (see docs/benchmarks.md).
bench-baseline:
	$(GO) run ./cmd/tensorlane bench --quick --write-baseline testdata/bench-baseline.json
