// Package ab is the A/B regression guard: it compares two builds of
// tensorlane (executables, or git revisions it builds) on a matrix of
// bench cells in one run, interleaving the two builds pair by pair so that
// load on a shared machine hits both alike, and gives each cell a verdict
// from a paired Wilcoxon signed-rank test with a Hodges-Lehmann confidence
// interval of head/base, Bonferroni-corrected over the matrix.
//
// "tensorlane bench --base A --head B" is its command line; docs/ci.md
// says how the tiers use it and what it was measured to catch. The stored
// baseline check (bench --check) stays CI's quick catch of a wrong path or
// a 2x drop: it needs no second build, but it cannot see a 10% slip.
package ab
