// Package tiers records what a test tier (make pr, nightly, release) did:
// one JSON summary per run (its steps with status and seconds, and the
// figures its results carry: bench ratios, A/B ratios, soak counts), a line
// appended to the tier's history kept in the repository, and a plot of
// every figure over the history, so that a slow drift shows.
package tiers
