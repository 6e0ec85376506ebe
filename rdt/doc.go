// Package rdt is tensorlane's user API: direct tensor transport between
// actors.
//
// A Runtime is one process, or one simulated host within a process. It owns
// device memory (simulated accelerators by default), an object table, a
// libp2p control host (ed25519 identity, Noise, yamux) and data servers.
// Actors spawned on it Put tensors that stay in device memory and get back a
// Ref: a few hundred bytes that name the object, its owner and its layout,
// and carry a capability token. Refs travel in control Messages (Send,
// Receive) or in any channel of the caller's (MarshalBinary).
//
// A reader calls Get(ctx, ref, dstDevice). The fabric planner compares owner
// and reader in the topology and takes the best path: a zero-copy view on the
// owner's own device, a device-to-device copy over a device link (p2p), or
// the authenticated, checksummed tcp transport between hosts. Explain tells
// which path a Get takes and why. Every blocking call honours its context
// and, without a deadline, Config.TransferTimeout.
//
// Errors are typed: ErrMalformedRef, ErrObjectNotFound, ErrObjectFreed,
// ErrUnauthorized (a forged token), ErrOutOfMemory, ErrTooSmall, ErrClosed;
// test them with errors.Is.
package rdt
