package hip_test

import "golang.org/x/sys/unix"

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}
