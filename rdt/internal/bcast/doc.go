// Package bcast holds the parts of rdt's broadcast (one object, or a batch,
// written to many readers' slots along a tree, pipelined in chunks) that
// need no runtime: its configuration and bounds (Config), the tree planner
// (PlanTree), the owner's bookkeeping of where each reader sits and where
// an orphan goes when its feeder fails (Tree), the numbering of a batch's
// chunks that each reader's relay counts (Chunks), the window of chunk
// writes each edge keeps in flight (Window), the notice codec (Msg) and
// the metrics.
//
// The seam to rdt is narrow and one-way: the planner takes endpoints and a
// function naming each edge's transport, the tree decides and rdt acts
// (sends the notices, writes the chunks), the window takes write
// functions, the codec is generic over the ref its children notices carry
// (rdt.Ref) and takes its parser, and the metrics take a Prometheus
// registerer. What needs the runtime (the owner's run, which pins the
// source and watches readers die; the readers' relays, which live in their
// slots) stays in rdt. rdt re-exports Config, Plan and Node as
// BroadcastConfig, BroadcastPlan and PlanNode, so its public API is
// unchanged, and a golden test holds the notices' bytes.
//
// It cannot import rdt (that would be a cycle) and must not import
// fabric/stack (archtest).
package bcast
