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
// Imports are not cached across reads yet, so each read pays the import
// (tens of microseconds on a GPU). A CUDA fd does not enforce the access
// itself as a read-only memory file does (see tensor/cuda's Export).

// exportDevice describes a device handle as a grant; the handle's
// descriptor always travels.
func (s *Server) exportDevice(pin tensor.Buffer, h tensor.Handle) (grant, int, error) {
	if h.Offset < 0 || h.Length < pin.Len() || h.Offset+h.Length > h.Size || h.Kind > 0x0f {
		unix.Close(h.FD)
		return grant{}, -1, fmt.Errorf("shm: device handle %v [%d,+%d) of %d bytes is inconsistent", h.Kind, h.Offset, h.Length, h.Size)
	}
	g := grant{flags: flagFD | flagDevice | byte(h.Kind)<<kindShift, mapID: s.mappingID(0, uint64(h.Kind), h.Offset, h.Length),
		fileSize: h.Size, objOff: h.Offset, objLen: h.Length}
	return g, h.FD, nil
}

// hostOrDevice returns b's first n bytes when the CPU can address them, or
// b itself when it is device memory that copies through its own engines.
func hostOrDevice(b tensor.Buffer, n int64) ([]byte, tensor.Buffer, error) {
	p, err := tensor.BytesOf(b)
	if err == nil {
		return p[:n], nil, nil
	}
	if root, _ := tensor.Unwrap(b); root != nil {
		if _, ok := root.(tensor.DeviceCopier); ok {
			return nil, b, nil
		}
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

// deviceTransfer imports the owner's device handle and copies: into our
// device buffer (device to device: same GPU or a peer) or host bytes p for
// a read, the other way for a push. The import is released before done.
func (c *Client) deviceTransfer(ctx context.Context, pc *pconn, key cacheKey, r fabric.Remote, g grant, fd int, p []byte, dev tensor.Buffer) error {
	h := tensor.Handle{FD: fd, Kind: tensor.HandleKind(g.flags >> kindShift), Size: g.fileSize, Offset: g.objOff, Length: g.objLen, Access: tensor.ReadOnly}
	if key.push {
		h.Access = tensor.Writable
	}
	imp, err := tensor.Import(ctx, h, dev)
	unix.Close(fd)
	if err != nil {
		// This process cannot open the owner's device memory (no CUDA
		// here): a path failure the planner falls back from, loudly.
		return fmt.Errorf("%w: import the owner's %v handle: %v", fabric.ErrNoPath, h.Kind, err)
	}
	defer imp.Release()
	switch {
	case dev != nil && key.push:
		err = tensor.Copy(ctx, imp, r.Offset, dev, 0, r.Length)
	case dev != nil:
		err = tensor.Copy(ctx, dev, 0, imp, r.Offset, r.Length)
	default:
		dc, ok := imp.(tensor.DeviceCopier)
		switch {
		case !ok:
			err = fmt.Errorf("%w: imported %v memory does not copy to the host", fabric.ErrNoPath, h.Kind)
		case key.push:
			err = dc.CopyIn(ctx, r.Offset, p)
		default:
			err = dc.CopyOut(ctx, r.Offset, p)
		}
	}
	if err != nil {
		return err
	}
	return c.confirm(pc)
}
