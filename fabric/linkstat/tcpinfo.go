package linkstat

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// errNotTCP is returned by Track for connections without a TCP socket.
var errNotTCP = errors.New("linkstat: not a TCP connection")

// rawOf returns the connection's raw socket.
func rawOf(conn net.Conn) (syscall.RawConn, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("%w: %T", errNotTCP, conn)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var soType int
	var serr error
	if err := raw.Control(func(fd uintptr) { soType, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL) }); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, serr
	}
	if soType != unix.IPPROTO_TCP {
		return nil, fmt.Errorf("%w: protocol %d", errNotTCP, soType)
	}
	return raw, nil
}

// cookieOf returns the kernel's socket cookie, the key the sock_ops program
// files the socket under.
func cookieOf(raw syscall.RawConn) (uint64, error) {
	var c uint64
	var serr error
	if err := raw.Control(func(fd uintptr) { c, serr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE) }); err != nil {
		return 0, err
	}
	return c, serr
}

// tcpInfo reads TCP_INFO and converts it to the figures the sock_ops
// program records, so both modes report the same numbers.
func tcpInfo(raw syscall.RawConn) (sample, error) {
	var ti *unix.TCPInfo
	var serr error
	if err := raw.Control(func(fd uintptr) { ti, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		return sample{}, err
	}
	if serr != nil {
		return sample{}, serr
	}
	return sample{
		srtt8: ti.Rtt << 3, rttMin: ti.Min_rtt, totalRetrans: ti.Total_retrans, cwnd: ti.Snd_cwnd,
		bytesAcked: ti.Bytes_acked, bytesReceived: ti.Bytes_received,
		segsOut: ti.Data_segs_out, segsIn: ti.Data_segs_in, state: uint32(ti.State),
	}, nil
}

// tcpStates names the kernel's TCP states (include/net/tcp_states.h).
var tcpStates = [...]string{"", "established", "syn_sent", "syn_recv", "fin_wait1", "fin_wait2", "time_wait",
	"close", "close_wait", "last_ack", "listen", "closing", "new_syn_recv", "bound_inactive"}

func stateName(s uint32) string {
	if int(s) < len(tcpStates) && s > 0 {
		return tcpStates[s]
	}
	return fmt.Sprintf("state%d", s)
}
