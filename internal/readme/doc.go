// Package readme keeps the README honest: its test compiles every Go
// snippet of README.md against the current API, so a renamed function or a
// changed signature fails CI instead of a new user's first build.
//
// Snippets are fragments: each is compiled as the body of its own function,
// with the names README snippets use without declaring them (ctx, trainer,
// reader, engine, rt, w, ref, slotRef, slotRefs, stateDict) available as
// package variables, and every variable a snippet declares marked used.
package readme
