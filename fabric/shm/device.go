package shm

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Device memory (tensor/cuda) rides the same socket, claim, pin and
// per-allocation export as memory files: the owner's buffer exports its
// own allocation's handle (tensor.Exportable with the grant's access: a
// CUDA VMM allocation's POSIX fd, or a legacy IPC handle in a sealed
// memfd), which travels by SCM_RIGHTS with every grant, and the reader
// imports it (tensor.Import: mapped read-only for reads, writable for
// pushes) and lets the device copy, then drops the import before its done.
// Imports are cached like mappings (per claim, direction and owner
// allocation; dropped when the owner refuses the claim or goes away), so a
// repeated read pays neither the import nor the descriptor. A CUDA fd does not enforce the access
// itself as a read-only memory file does (see tensor/cuda's Export).

// exportDevice describes a device handle as a grant. The mapping id names
// the allocation (its serial, h.ID, never reused) and the object's place in
// it, so a reader that imported it for an earlier grant gets no descriptor:
// it copies through its cached import, under this grant's fresh pin.
func (s *Server) exportDevice(pin tensor.Buffer, h tensor.Handle, req request) (grant, int, error) {
	// A device handle is the allocation itself (never a private copy):
	// the object's bytes start at Offset, and the request must fall in them.
	if h.Offset < 0 || h.Length < 0 || h.Offset+h.Length > h.Size || h.Kind > 0x0f || h.ID == 0 || h.Start != 0 || h.Copy ||
		req.offset < 0 || req.offset+req.length > h.Length {
		unix.Close(h.FD)
		return grant{}, -1, fmt.Errorf("shm: device handle %v #%d [%d,+%d) of %d bytes does not hold [%d,+%d) or is inconsistent",
			h.Kind, h.ID, h.Offset, h.Length, h.Size, req.offset, req.length)
	}
	g := grant{flags: flagDevice | byte(h.Kind)<<kindShift, mapID: s.mappingID(uint64(h.Kind), h.ID, h.Offset, h.Length, 0),
		fileSize: h.Size, objOff: h.Offset, objLen: h.Length}
	if req.have == g.mapID {
		unix.Close(h.FD)
		return g, -1, nil
	}
	g.flags |= flagFD
	return g, h.FD, nil
}

// hostOrDevice returns b's first n bytes when the CPU can address them, or
// b itself when it is device memory that copies through its own engines.
func hostOrDevice(b tensor.Buffer, n int64) ([]byte, tensor.Buffer, error) {
	p, err := tensor.BytesOf(b)
	if err == nil {
		return p[:n], nil, nil
	}
	if tensor.IsDevice(b) {
		return nil, b, nil
	}
	return nil, nil, err
}

// hostToDevice copies between a mapped memory file (obj) and device
// memory: a read into dev, or a push of dev into obj.
func hostToDevice(ctx context.Context, push bool, obj []byte, dev tensor.Buffer) error {
	root, off := tensor.Unwrap(dev)
	dc := root.(tensor.DeviceCopier)
	if push {
		return dc.CopyOut(ctx, off, obj)
	}
	return dc.CopyIn(ctx, off, obj)
}

// importDevice imports the owner's device handle (for our buffer's device
// when it is device memory): mapped read-only for reads, writable for
// pushes. The mapping it returns holds one reference, for the caller.
func (c *Client) importDevice(ctx context.Context, key cacheKey, g grant, fd int, dev tensor.Buffer) (*mapping, error) {
	h := tensor.Handle{FD: fd, Kind: tensor.HandleKind(g.flags >> kindShift), Size: g.fileSize, Offset: g.objOff, Length: g.objLen, Access: tensor.ReadOnly}
	if key.push {
		h.Access = tensor.Writable
	}
	imp, err := tensor.Import(ctx, h, dev)
	unix.Close(fd)
	if err != nil {
		// This process cannot open the owner's device memory (no CUDA
		// here): a path failure the planner falls back from, loudly.
		return nil, fmt.Errorf("%w: import the owner's %v handle: %v", fabric.ErrNoPath, h.Kind, err)
	}
	return &mapping{key: key, id: g.mapID, objOff: g.objOff, objLen: g.objLen, dev: imp, devSize: g.fileSize, refs: 1}, nil
}

// deviceCopy copies n bytes between an imported device allocation (imp,
// whose byte 0 is the object's first granted byte; off is in imp) and our
// side: device memory dev, or host bytes p; a read into ours, a push from
// ours.
func deviceCopy(ctx context.Context, push bool, imp tensor.Buffer, off, n int64, p []byte, dev tensor.Buffer) error {
	switch {
	case dev != nil && push:
		return tensor.Copy(ctx, imp, off, dev, 0, n)
	case dev != nil:
		return tensor.Copy(ctx, dev, 0, imp, off, n)
	}
	dc, ok := imp.(tensor.DeviceCopier)
	switch {
	case !ok:
		return fmt.Errorf("%w: imported device memory does not copy to the host", fabric.ErrNoPath)
	case push:
		return dc.CopyIn(ctx, off, p)
	default:
		return dc.CopyOut(ctx, off, p)
	}
}
