package shm

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/privdir"
)

// DefaultDir returns the private directory sockets are created in by
// default: the first of $XDG_RUNTIME_DIR/tensorlane, $TMPDIR/tensorlane-<uid>
// and <user cache>/tensorlane/run that is ours alone. A directory another
// local user planted in a shared tmp is skipped, so it can neither hijack
// our sockets nor switch shm off.
func DefaultDir() string {
	dir, _, err := privdir.UserDir()
	if err != nil {
		return privdir.Candidates()[0] // privateDir then says why it is refused
	}
	return dir
}

// privateDir makes sure dir exists, is a real directory (not a link), is
// ours and is closed to everyone else, so no other user can plant or swap a
// socket in it.
func privateDir(dir string) error {
	if err := privdir.Ensure(dir); err != nil {
		return fmt.Errorf("shm: socket directory: %w", err)
	}
	return nil
}

// socketName returns a fresh socket file name: the pid says whose it is,
// the random part keeps several servers of one process apart.
func socketName() string {
	var r [6]byte
	rand.Read(r[:])
	return "shm-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(r[:]) + ".sock"
}

var randReader = rand.Reader

// sweepStale removes sockets of servers that died without closing (a
// SIGKILL leaves the file behind) from dir. A socket is stale when the pid
// in its name is gone and nothing accepts on it: the pid alone could be a
// live server in another pid namespace sharing this directory. It returns
// how many it removed.
func sweepStale(dir string) int {
	names, _ := filepath.Glob(filepath.Join(dir, "shm-*-*.sock"))
	removed := 0
	for _, path := range names {
		pidStr, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(path), "shm-"), "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := unix.Kill(pid, 0); err == nil || errors.Is(err, unix.EPERM) {
			continue // that pid is alive here
		}
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err == nil {
			c.Close()
			continue
		}
		if errors.Is(err, unix.ECONNREFUSED) && os.Remove(path) == nil {
			removed++
		}
	}
	return removed
}

// maxSocketPath is the longest path a sockaddr_un holds (with its NUL).
const maxSocketPath = 107

// peerUID returns the uid of the process at the other end of c.
func peerUID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return -1, err
	}
	if cerr != nil {
		return -1, cerr
	}
	return int(cred.Uid), nil
}

// sameUser refuses a peer that runs as another user: shared memory is
// shared within one user (a grant reaches one object, but the file modes
// and seals that keep it to that are per user), so only our own user may
// hold one.
func sameUser(c *net.UnixConn) error {
	uid, err := peerUID(c)
	if err != nil {
		return fmt.Errorf("%w: SO_PEERCRED: %v", fabric.ErrUnauthorized, err)
	}
	if uid != os.Getuid() {
		return fmt.Errorf("%w: peer runs as uid %d, we run as %d (shm serves the same user only)", fabric.ErrUnauthorized, uid, os.Getuid())
	}
	return nil
}

// packetRW adapts a SOCK_SEQPACKET connection to the byte-stream reads of
// the peerauth handshake: a packet read with a short buffer would lose its
// tail, so each packet is read whole and served from a buffer.
type packetRW struct {
	c    *net.UnixConn
	buf  []byte
	left []byte
}

func newPacketRW(c *net.UnixConn) *packetRW { return &packetRW{c: c, buf: make([]byte, 4096)} }

func (p *packetRW) Read(b []byte) (int, error) {
	if len(p.left) == 0 {
		n, err := p.c.Read(p.buf)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			// A zero-length packet from a peer that shut down reads as EOF.
			return 0, errEOFPacket
		}
		p.left = p.buf[:n]
	}
	n := copy(b, p.left)
	p.left = p.left[n:]
	return n, nil
}

// Write sends b as one packet. An empty write sends nothing: on a byte
// stream it would carry nothing, while an empty packet reads as EOF.
func (p *packetRW) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	return p.c.Write(b)
}

// pending reports bytes received but not consumed: after the handshake
// there must be none, or the two ends are out of step.
func (p *packetRW) pending() int { return len(p.left) }

var errEOFPacket = errors.New("shm: connection closed")

// oobSpace is the control buffer recvPacket needs: room for more
// descriptors than any packet may carry, so extra ones are seen (and
// closed) rather than silently truncated.
var oobSpace = unix.CmsgSpace(4 * (maxAnnounce + 4))

// recvPacket reads one packet into buf, and any descriptors sent with it
// through oob (oobSpace bytes, reused by the caller). Descriptors of a
// packet that is rejected are closed here.
func recvPacket(c *net.UnixConn, buf, oob []byte) (p []byte, fds []int, err error) {
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if oobn > 0 {
		if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
			for _, m := range msgs {
				if got, rerr := unix.ParseUnixRights(&m); rerr == nil {
					fds = append(fds, got...)
				}
			}
		}
	}
	if err == nil && n == 0 {
		err = errEOFPacket
	}
	if err == nil && flags&unix.MSG_CTRUNC != 0 && flags&unix.MSG_TRUNC == 0 && len(fds) < (len(oob)-unix.CmsgSpace(0))/4 {
		// The control buffer had room for more: the kernel could not
		// install them (it drops those), because our table is full.
		err = ErrDescriptorLimit
	}
	if err == nil && flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		err = fmt.Errorf("%w: packet or its descriptors truncated (flags %#x)", fabric.ErrCorrupt, flags)
	}
	if err != nil {
		closeAll(fds)
		return nil, nil, err
	}
	return buf[:n], fds, nil
}

// sendPacket writes one packet, with fd attached when fd >= 0.
func sendPacket(c *net.UnixConn, p []byte, fd int) error {
	if fd >= 0 {
		return sendPacketFDs(c, p, []int{fd})
	}
	return sendPacketFDs(c, p, nil)
}

// sendPacketFDs writes one packet with fds attached (none when empty).
func sendPacketFDs(c *net.UnixConn, p []byte, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err := c.WriteMsgUnix(p, oob, nil)
	return err
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
