package harness

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"testing"
)

// TestServe drives the A/B guard's child protocol in process: a header
// with the bytes a round moves, one "<wall> <cpu>" answer per "r", and a
// clean close on "q" (goleak in TestMain checks nothing is left).
func TestServe(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- Serve(t.Context(), Config{}, PathSHM, ModePull, 1<<20, 1, inR, outW)
		outW.Close()
	}()
	rd := bufio.NewReader(outR)
	head, err := rd.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if want := ServeProtocol + " 1048576\n"; head != want {
		t.Fatalf("header %q, want %q", head, want)
	}
	for range 3 {
		fmt.Fprintln(inW, "r")
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		var wall, cpu int64
		if _, err := fmt.Sscanf(line, "%d %d", &wall, &cpu); err != nil || wall <= 0 || cpu < 0 {
			t.Fatalf("answer %q: %v", line, err)
		}
	}
	fmt.Fprintln(inW, "q")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	inW.Close()
}

func TestServeRefusesBadCells(t *testing.T) {
	for _, c := range []struct {
		path, mode string
		size       int64
		c          int
	}{{"nvme", ModePull, 1 << 20, 1}, {PathLocal, ModePush, 1 << 20, 1}, {PathSHM, "sideways", 1 << 20, 1}, {PathSHM, ModePull, 0, 1}, {PathSHM, ModePull, 1, 0}} {
		err := Serve(t.Context(), Config{}, c.path, c.mode, c.size, c.c, strings.NewReader(""), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "no cell") {
			t.Errorf("Serve(%v) = %v", c, err)
		}
	}
}

func TestSlowdownEnv(t *testing.T) {
	t.Setenv(SlowdownEnv, "shm=0.1, rdma=0.05")
	s, err := slowdowns()
	if err != nil || s[PathSHM] != 0.1 || s[PathRDMA] != 0.05 {
		t.Errorf("slowdowns() = %v, %v", s, err)
	}
	for _, bad := range []string{"shm", "shm=", "shm=-1", "=0.1", "shm=abc", "shm=11"} {
		t.Setenv(SlowdownEnv, bad)
		if _, err := slowed(PathSHM, nil); err == nil || !strings.Contains(err.Error(), SlowdownEnv) {
			t.Errorf("%s=%q: %v", SlowdownEnv, bad, err)
		}
	}
}
