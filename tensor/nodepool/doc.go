// Package nodepool is a node's warm pool of shareable host memory, held by
// a helper process that outlives the runtimes it serves.
//
// Populating fresh shared pages (the kernel allocating and zeroing each
// 4 KiB page) costs more than the copy that fills them: a Ray trainer's
// first 256 MiB state dict paid 0.15-0.26 s for it on a 2-core VM (issue
// #23). Ray's object store never pays it, since its memory stays resident
// in a process that outlives the actors. A per-process pre-faulted pool
// would, but costs its size in every actor. This package is the per-node
// alternative: one helper process per node (per runtime directory) keeps
// a budget of memfds whose pages are populated, and hands them, one per
// request, to the node's runtimes over a unix socket in the runtime
// directory (SCM_RIGHTS), refilling in the background with the sizes
// asked for lately. A runtime adopts a memfd as a fresh slab
// (tensor.SlabConfig.Source) and the helper forgets it: the memory is the
// runtime's alone from then on, as if it had made it itself.
//
// Lifetime: Serve holds an exclusive lock beside the socket, so one helper
// serves a directory; each client keeps its connection for its runtime's
// life, and the helper ends once no client has been connected for
// Config.Idle (the node's runtimes are gone), removing its socket. A
// client that finds no helper starts one with the command it was given
// (Open's helper argv, which must detach: return once the server runs in
// the background), and falls back to its own allocation, counted, until
// the helper answers; a pool that is empty or asked for more than it holds
// is a miss, counted the same way.
//
// Trust: the socket lives in the user's private runtime directory (mode
// 0700), and the memory handed out is fresh (zeroed by the kernel, never
// mapped by anyone but the helper), so a client learns nothing from it.
package nodepool
