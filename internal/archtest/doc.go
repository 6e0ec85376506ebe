// Package archtest enforces the import rules of the house (DESIGN.md's
// package table, spelled out in docs/architecture.md): its test lists every
// package of the module with `go list` and fails on an import that points
// the wrong way, on a test-only helper imported by non-test code, and on a
// package without a doc comment.
//
// The rules live in Rules, one row a package tree, so a change to the
// layering is a change to that table and to docs/architecture.md together.
// Only non-test imports count: a package's tests may reach upwards (rdt's
// tests build runtimes over fabric transports; internal/multihost's tests
// drive rdt through worker processes).
package archtest
