// Package tcp is tensorlane's path of last resort: tensors over dedicated
// TCP data connections, which reach any host.
//
// A Server (owner side) serves reads of the objects its fabric.Source
// resolves and, with a fabric.Sink, accepts pushes; a Transport (reader
// side, and pusher) implements fabric.Transport and fabric.Writer.
//
// Every connection is authenticated against the libp2p identities of both
// runtimes (fabric/internal/peerauth) before it carries a byte. Data moves
// in blocks of ChunkSize (256 KiB) in internal/tcodec's self-describing
// format: each block carries its codec, lengths and an XXH3-64 checksum of the raw
// bytes, so corruption anywhere between the two memories is reported as
// fabric.ErrCorrupt and never delivered; XXH3 is not a MAC, so this
// guards against faults, not against an attacker on the wire. On an
// encrypted connection the AEAD that authenticates every record is the
// check of raw blocks instead, which an attacker cannot forge either
// (flagSealed: one pass over each byte fewer on both ends; an owner from
// before it is asked again with checksums; Config.SealedChecksums keeps
// both; docs/security.md, "Integrity of the bytes in flight", says what
// each mode guarantees and what it does not cover). An object whose
// buffer is tensor.Summed (sealed: its bytes never change) has its blocks'
// checksums cached: the first read or push computes and stores them, later
// ones send them without reading the object again (counted in
// tensorlane_tcp_owner_checksums_total and
// tensorlane_tcp_push_checksums_total by source). Raw blocks go
// out with writev straight from the owner's memory and land straight in
// the reader's buffer; large transfers are striped over several
// connections (Streams).
//
// Small transfers are dominated by fixed costs, which are kept per
// connection rather than per transfer: connections to an owner are pooled
// (up to MaxConns open at once, 64 by default, all kept while they are
// used; transfers beyond that queue for the first one given back instead
// of dialing a storm of handshakes), deadlines are re-armed at most every
// StallTimeout/8, a small push goes out with its request in one writev
// (one round trip, not two), and a small transfer allocates next to
// nothing. Connections opened and waits for one are counted in
// tensorlane_tcp_dials_total and tensorlane_tcp_conn_waits_total.
//
// A batch (ReadBatch, fabric.BatchReader) pipelines: the requests for many
// objects of one owner go out back to back on a few connections and the
// answers stream back in order, one round trip per connection instead of
// one per object (batch.go).
//
// Preconnect opens and authenticates the connections a read would use
// before the read (rdt's Actor.Warm calls it when a reader learns of a ref
// ahead of its Get), so a first read does not pay the dial and handshake.
//
// Compression is lossless and per block (byte planes and huff0 for
// floating-point tensors, s2 otherwise; fabric.Remote.DType says which). In
// the default CompressAuto mode a transfer is compressed only when the
// measured throughput of the link to that peer (an EWMA over recent
// transfers) is below the codec's measured throughput, and only while
// compressed transfers to that peer keep beating raw ones, so a fast link
// is never slowed down. Each decision is logged at Debug and counted in
// tensorlane_tcp_compression_decisions_total{compress,reason}; what
// compression saved is in tensorlane_tcp_compressed_{raw,wire}_bytes_total.
//
// Failures are typed: fabric.ErrStalled when a transfer makes no progress
// for StallTimeout, fabric.ErrPeerClosed when the owner goes away,
// fabric.ErrCorrupt, and the owner's refusals (fabric.ErrUnauthorized,
// ErrObjectNotFound, ...) as it reported them.
package tcp
