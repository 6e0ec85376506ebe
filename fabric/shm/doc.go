// Package shm implements the cross-process same-host transports: "p2p"
// (devices the topology joins with a device link, as CUDA IPC over NVLink)
// and "shm" (any two devices, a copy through shared host memory, as NCCL
// SHM). On this library's simulated accelerators both are the same real
// mechanism: the owner passes the descriptor of the memfd behind the
// object's own allocation (tensor.Exportable: one allocation per handle,
// as CUDA's cuMemExportToShareableHandle), and the reader maps the object's
// pages and copies them straight into its destination buffer. No byte
// crosses a socket.
//
// # Owner side
//
// A Server listens on a path-based SOCK_SEQPACKET Unix socket in a private
// directory ($TMPDIR/tensorlane-<uid>, mode 0700; the socket is removed on
// Close). Path-based, not abstract: abstract sockets belong to a network
// namespace, and runtimes in different namespaces that claim one host must
// still reach each other. Every connection first runs the peerauth
// handshake that binds both libp2p identities, and SO_PEERCRED must show
// the peer runs as our own user.
//
// # Reader side
//
// A Client holds a connection pool per owner and a mapping cache; its P2P
// and SHM methods return the two transport views (New and NewP2P make a
// view with a client of its own). A read sends the claim and byte range;
// the owner resolves it through its fabric.Source (which pins the object),
// and answers with the object's place in its allocation and, unless the
// reader already has it mapped, the allocation's descriptor (SCM_RIGHTS),
// opened read-only. The reader maps only the object's pages, PROT_READ,
// MAP_SHARED|MAP_POPULATE, copies in chunks that check the context, and
// then sends "done"; the owner unpins. A read therefore costs one round
// trip with the owner (done needs no answer), plus the copy.
//
// # Batches
//
// Transport also implements fabric.BatchReader: ReadBatch asks an owner
// for up to 256 objects in one request (a frame) and gets one reply with
// every item's grant or refusal; the granted items' descriptors come with
// it, as many per message as the kernel allows (SCM_MAX_FD, 253), and an
// item whose mapping this reader caches, or whose slab this connection
// holds, needs none. The reader copies every item (large ones on several
// cores) and sends one done; the owner holds every pin of the frame until
// then. Each item is checked as a single read is (its claim and range by
// the owner, its grant by the reader) and fails alone: freed, unknown,
// forged, stale, or a range outside the object. A batch pins at most 256
// MiB per frame, two frames per owner at a time. A reader whose
// descriptor table fills up mid-batch gets ErrDescriptorLimit; an owner
// that does not know batches (wire version 4) refuses them, and the items
// are read one by one. batchwire.go has the frames (wire version 5:
// single exchanges are unchanged and still say version 4).
//
// It implements fabric.BatchWriter the same way: WriteBatch asks an owner
// for up to 256 of its sinks in one request (opBatchPush), each granted
// as a single push is (writable, exactly the sink's own pages, its
// writable mapping cached), copies every source into its sink and sends
// one done. A closed, unknown, forged, stale or busy sink
// (fabric.ErrSinkBusy) fails its item alone; an owner that knows only
// read batches refuses the frame and the items are pushed one by one.
//
// # Slab grants (opt-in, one trust scope)
//
// An owner whose memory is a tensor.SlabMemory shares its objects as
// places in a few large slab files: the first grant of a slab on a
// connection carries its descriptor, later ones only an offset and length,
// and the reader maps each slab once, read-only, for all the objects in it
// (no mmap and, once touched, no page fault for later objects). Slab
// grants go only to readers that proved the owner's cluster key; a view of
// a slab object makes the owner hold its range against reuse until the
// reader's unview or its last connection closes. slab.go has the details,
// docs/security-shm-grants.md what a slab reader can see.
//
// After its first slab grant from an owner, a reader asks for the owner's
// other slabs and builds the page tables of all of them in the background,
// while no transfer of its own runs (prefetch.go, Config.PrefetchBytes):
// without huge pages for shared memory, those page tables are most of what
// a first read of a slab range costs over a later one.
//
// # Revocation
//
// Mappings are cached per (owner, object, incarnation, direction: read
// mappings read-only, push mappings writable), but they are never
// trusted on their own: every read and push re-validates the claim with the owner
// (one round trip on an open connection, a few microseconds), and the owner
// holds the pin for the whole copy, until the reader's "done". The
// alternative, owners notifying readers when an object is freed, would need
// a free hook the fabric.Source interface does not have and would still
// race with a copy in progress; the per-read check cannot. A claim the
// owner refuses (freed, unknown, stale) drops its mapping, and the read
// fails with the owner's error (fabric.ErrObjectFreed). The owner never
// unpins on its own without first closing the connection, so a connection
// still open when the copy has ended (checked without blocking, by polling
// for a hang-up) proves the pin was held for all of it; when the owner
// died or dropped the connection mid-copy the read fails with
// fabric.ErrPeerClosed and the destination must not be used.
// An owner that becomes unreachable has all its mappings dropped, since
// they keep its memory alive. The owner's memory never recycles an
// allocation it exported, so even a mapping kept after a Free (by this
// cache, or by a hostile reader) shows the freed object, never the next
// one.
//
// # Views (zero copy)
//
// Transport also implements fabric.Viewer: View runs the same exchange as
// a read (the claim re-validated, a read-only grant of the object's
// allocation) but copies nothing; it maps the object's pages without
// MAP_POPULATE, so its cost does not grow with the object, and returns
// them as a read-only host-visible buffer that holds the mapping until
// Release. The owner unpins at once ("done"); what keeps the memory alive
// is the caller's lease (rdt.Actor.View), and what keeps a view safe after
// a Free is, as above, that exported memory is never recycled.
//
// Large copies (reads, pushes) run on several cores (internal/pcopy),
// each worker guarded against SIGBUS.
//
// # Push
//
// Transport also implements fabric.Writer: the writer asks the reader's
// server to open its fabric.Sink (ServerConfig.Sink) for the claim, maps
// the sink's pages writable (the descriptor is the sink's own allocation,
// nothing else of the owner's memory), copies in and sends "done"; the
// server then unpins the sink.
// Push mappings are cached like read mappings, apart from them (a read
// mapping is never writable), so the broadcast pattern, one reserved slot
// pushed into over and over, maps its pages once: every later push still
// has the sink opened and pinned by its owner, which sends no descriptor
// when the writer already maps that region, and a sink the owner refuses
// (closed, freed) drops the mapping before anything is written. A push
// ends as a read does: the copy is complete once it returns, and a
// connection still open after the copy proves the sink was pinned for all
// of it, so the writer does not wait for the owner to unpin (the caller's
// own completion notice, as rdt's, follows the return).
//
// # Trust model
//
// Shared memory is shared by the same user only (SO_PEERCRED), after the
// peerauth handshake. A grant reaches the granted object's allocation and
// nothing else (see tensor.Exportable):
//
//   - a reader gets a read-only descriptor of the object's own memfd: it
//     cannot see other objects of the owner's device, objects allocated
//     later, or memory reused after a Free (exported memory is never
//     recycled); the file has mode 0400 and is sealed with
//     F_SEAL_FUTURE_WRITE, so reopening it (or the owner's own descriptor,
//     through /proc/PID/fd) for writing is refused to a process without
//     CAP_DAC_OVERRIDE, and writing through a reopened descriptor is
//     refused to everyone;
//   - a pusher gets a writable descriptor of the sink's own memfd: it can
//     write (and read) that slot and nothing else;
//   - no holder can resize the file (F_SEAL_SHRINK, F_SEAL_GROW), so none
//     can fault the owner by truncating memory under its mapping.
//
// An object shared read-only is sealed, so it cannot be pushed into
// afterwards (the push is refused, and the planner takes another path).
// A handle reaches a whole allocation (CUDA's granularity too), so an
// owner whose object is a view of part of an allocation exports a private
// copy of the view (tensor.ViewShare, as rdt does); the grant then says
// which object byte the file starts with, the reader maps only the copy,
// and its transfer stats say so (fabric.Stats.ViewCopy).
// What a process running as root, or as our user with ptrace rights over
// the owner, can still do is in docs/security-shm-grants.md: such a
// process can read and write the owner's memory without any grant.
//
// # Failures
//
// Every socket operation is bounded by StallTimeout (fabric.ErrStalled)
// and by the caller's context; an owner that closes or dies yields
// fabric.ErrPeerClosed; a damaged grant (it carries a CRC-32C, since its
// offsets say which memory to copy) yields fabric.ErrCorrupt and never
// wrong data.
package shm
