package linkstat

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// Offsets into struct bpf_sock_ops (include/uapi/linux/bpf.h). The layout
// is ABI: fields are only ever appended.
const (
	opOff            = 0
	sndCwndOff       = 76
	srttOff          = 80 // srtt_us, which the kernel keeps as RTT << 3
	stateOff         = 88
	rttMinOff        = 92
	totalRetransOff  = 136
	dataSegsInOff    = 144
	dataSegsOutOff   = 152
	bytesReceivedOff = 168
	bytesAckedOff    = 176
)

// sock_ops callbacks and flags (uapi bpf.h).
const (
	opActiveEstablished  = 4
	opPassiveEstablished = 5
	opRetrans            = 9
	opState              = 10
	opRTT                = 12
	opHdrOptLen          = 14
	// BPF_SOCK_OPS_RETRANS_CB_FLAG | STATE_CB_FLAG | RTT_CB_FLAG |
	// WRITE_HDR_OPT_CB_FLAG: a callback on every retransmission, state
	// change and RTT sample (the sending side), and on every segment sent,
	// ACKs included, so the receiving side's byte count is current as of
	// its last ACK. (The program reserves no option space, so the kernel
	// only asks, HDR_OPT_LEN_CB, and writes nothing.)
	cbFlags = 0x2 | 0x4 | 0x8 | 0x40
)

// valueSize is the map value the program writes: a sample of one socket.
//
//	0 srtt_us<<3  4 rtt_min_us  8 total_retrans  12 snd_cwnd
//	16 bytes_acked (u64)  24 bytes_received (u64)
//	32 data_segs_out  36 data_segs_in  40 state  44 last op
const valueSize = 48

// sample is the decoded map value.
type sample struct {
	srtt8, rttMin, totalRetrans, cwnd uint32
	bytesAcked, bytesReceived         uint64
	segsOut, segsIn, state, op        uint32
}

var errShortValue = errors.New("linkstat: short map value")

func decodeSample(b []byte) (sample, error) {
	if len(b) < valueSize {
		return sample{}, fmt.Errorf("%w: %d bytes, want %d", errShortValue, len(b), valueSize)
	}
	le := binary.LittleEndian // BPF maps use the host's order; our targets are little-endian
	return sample{
		srtt8: le.Uint32(b[0:]), rttMin: le.Uint32(b[4:]), totalRetrans: le.Uint32(b[8:]), cwnd: le.Uint32(b[12:]),
		bytesAcked: le.Uint64(b[16:]), bytesReceived: le.Uint64(b[24:]),
		segsOut: le.Uint32(b[32:]), segsIn: le.Uint32(b[36:]), state: le.Uint32(b[40:]), op: le.Uint32(b[44:]),
	}, nil
}

// sockOpsProgram is the sock_ops program, written with cilium/ebpf's
// assembler so no clang is needed at build time. On connection
// establishment it asks the kernel for RTT, retransmission and state
// callbacks; on each of those it writes the socket's counters into the map,
// keyed by the socket cookie (which user space reads with SO_COOKIE).
func sockOpsProgram(statsFD int) asm.Instructions {
	st := func(off int16, ctxOff int16, size asm.Size) asm.Instructions {
		return asm.Instructions{
			asm.LoadMem(asm.R2, asm.R6, ctxOff, size),
			asm.StoreMem(asm.RFP, -56+off, asm.R2, size),
		}
	}
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, opOff, asm.Word),
		asm.JEq.Imm(asm.R2, opActiveEstablished, "set_flags"),
		asm.JEq.Imm(asm.R2, opPassiveEstablished, "set_flags"),
		asm.JEq.Imm(asm.R2, opRTT, "record"),
		asm.JEq.Imm(asm.R2, opRetrans, "record"),
		asm.JEq.Imm(asm.R2, opState, "record"),
		asm.JEq.Imm(asm.R2, opHdrOptLen, "record"),
		asm.Ja.Label("out"),

		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("set_flags"),
		asm.Mov.Imm(asm.R2, cbFlags),
		asm.FnSockOpsCbFlagsSet.Call(),

		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("record"),
		asm.FnGetSocketCookie.Call(),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
	}
	insns = append(insns, st(0, srttOff, asm.Word)...)
	insns = append(insns, st(4, rttMinOff, asm.Word)...)
	insns = append(insns, st(8, totalRetransOff, asm.Word)...)
	insns = append(insns, st(12, sndCwndOff, asm.Word)...)
	insns = append(insns, st(16, bytesAckedOff, asm.DWord)...)
	insns = append(insns, st(24, bytesReceivedOff, asm.DWord)...)
	insns = append(insns, st(32, dataSegsOutOff, asm.Word)...)
	insns = append(insns, st(36, dataSegsInOff, asm.Word)...)
	insns = append(insns, st(40, stateOff, asm.Word)...)
	insns = append(insns, st(44, opOff, asm.Word)...)
	insns = append(insns,
		asm.LoadMapPtr(asm.R1, statsFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -56),
		asm.Mov.Imm(asm.R4, 0), // BPF_ANY
		asm.FnMapUpdateElem.Call(),

		asm.Mov.Imm(asm.R0, 1).WithSymbol("out"),
		asm.Return(),
	)
	return insns
}

// bpfCollector is the eBPF mode's kernel side: the map and the attached
// program.
type bpfCollector struct {
	stats *ebpf.Map
	prog  *ebpf.Program
	link  link.Link
}

// attachBPF loads the program and attaches it to the cgroup v2 directory.
func attachBPF(cgroup string, entries int) (*bpfCollector, error) {
	// Kernels before 5.11 account BPF memory to RLIMIT_MEMLOCK.
	_ = rlimit.RemoveMemlock()
	m, err := ebpf.NewMap(&ebpf.MapSpec{
		Name: "tl_linkstat", Type: ebpf.LRUHash, KeySize: 8, ValueSize: valueSize, MaxEntries: uint32(entries),
	})
	if err != nil {
		return nil, fmt.Errorf("create map: %w", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "tl_sockops", Type: ebpf.SockOps, License: "GPL", Instructions: sockOpsProgram(m.FD()),
	})
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("load sock_ops program: %w", err)
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: ebpf.AttachCGroupSockOps, Program: prog})
	if err != nil {
		prog.Close()
		m.Close()
		return nil, fmt.Errorf("attach sock_ops to cgroup %s: %w", cgroup, err)
	}
	return &bpfCollector{stats: m, prog: prog, link: l}, nil
}

func (b *bpfCollector) lookup(cookie uint64) (sample, bool) {
	v := make([]byte, valueSize)
	if err := b.stats.Lookup(&cookie, &v); err != nil {
		return sample{}, false
	}
	s, err := decodeSample(v)
	return s, err == nil
}

func (b *bpfCollector) forget(cookie uint64) { _ = b.stats.Delete(&cookie) }

func (b *bpfCollector) close() error {
	return errors.Join(b.link.Close(), b.prog.Close(), b.stats.Close())
}
