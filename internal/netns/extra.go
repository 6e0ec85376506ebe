package netns

// Additions for the multi-host fault tests (internal/multihost): packet
// loss without netem, and interface counters.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// Dropper drops a share of a device's egress packets at random with a tcx
// BPF program, for kernels built without netem (whose "loss" it stands in
// for). Close detaches it.
type Dropper struct {
	prog  *ebpf.Program
	count *ebpf.Map
	link  link.Link
	once  sync.Once
	err   error
}

// DropRandom attaches a Dropper to dev's egress that drops percent (0-100)
// of the packets. It needs BPF and tcx (Linux 6.6 or later); otherwise the
// error matches ErrUnavailable.
func (ns *NS) DropRandom(dev string, percent float64) (*Dropper, error) {
	if percent < 0 || percent > 100 || math.IsNaN(percent) {
		return nil, fmt.Errorf("netns: drop percent %v outside 0-100", percent)
	}
	count, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		return nil, fmt.Errorf("%w: bpf map: %v", ErrUnavailable, err)
	}
	// The program compares 16 random bits with the threshold, so the
	// resolution is 1/65536.
	threshold := int32(percent / 100 * 65536)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{
			asm.FnGetPrandomU32.Call(),
			asm.RSh.Imm(asm.R0, 16),
			asm.JGE.Imm(asm.R0, threshold, "pass"),
			// count the drop: *map[0] += 1
			asm.Mov.Imm(asm.R1, 0),
			asm.StoreMem(asm.RFP, -4, asm.R1, asm.Word),
			asm.LoadMapPtr(asm.R1, count.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "drop"),
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R0, 2).WithSymbol("drop"), // TCX_DROP
			asm.Return(),
			asm.Mov.Imm(asm.R0, -1).WithSymbol("pass"), // TCX_NEXT
			asm.Return(),
		},
	})
	if err != nil {
		count.Close()
		return nil, fmt.Errorf("%w: bpf program: %v", ErrUnavailable, err)
	}
	d := &Dropper{prog: prog, count: count}
	err = ns.Do(func() error {
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		d.link, err = link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: prog, Attach: ebpf.AttachTCXEgress})
		return err
	})
	if err != nil {
		prog.Close()
		count.Close()
		return nil, fmt.Errorf("%w: attach tcx to %s in %s: %v", ErrUnavailable, dev, ns.Name, err)
	}
	return d, nil
}

// Dropped is how many packets the Dropper has dropped.
func (d *Dropper) Dropped() uint64 {
	var n uint64
	if err := d.count.Lookup(uint32(0), &n); err != nil {
		return 0
	}
	return n
}

// Close detaches the program; it is idempotent.
func (d *Dropper) Close() error {
	d.once.Do(func() {
		d.err = errors.Join(d.link.Close(), d.prog.Close(), d.count.Close())
	})
	return d.err
}

// LinkStats are a device's counters.
type LinkStats struct {
	RxBytes, TxBytes, RxPackets, TxPackets, TxDropped uint64
}

// Stats reads dev's counters (`ip -s -j link show`).
func (ns *NS) Stats(ctx context.Context, dev string) (LinkStats, error) {
	out, err := run(ctx, "ip", "-n", ns.Name, "-s", "-j", "link", "show", "dev", dev)
	if err != nil {
		return LinkStats{}, err
	}
	var v []struct {
		Stats64 struct {
			Rx struct{ Bytes, Packets uint64 }          `json:"rx"`
			Tx struct{ Bytes, Packets, Dropped uint64 } `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &v); err != nil || len(v) != 1 {
		return LinkStats{}, fmt.Errorf("netns: stats of %s in %s: %q: %v", dev, ns.Name, out, err)
	}
	s := v[0].Stats64
	return LinkStats{RxBytes: s.Rx.Bytes, TxBytes: s.Tx.Bytes, RxPackets: s.Rx.Packets, TxPackets: s.Tx.Packets, TxDropped: s.Tx.Dropped}, nil
}
