// Command twoprocess runs two processes on one host, each with its own
// devices, passing a tensor by reference: the way a scheduler runs GPU
// workers (each gets CUDA_VISIBLE_DEVICES; here TENSORLANE_DEVICES).
//
//	go run ./examples/twoprocess
//
// The parent claims gpu:1 of simulated host h0 and starts itself again as
// the owner, which claims gpu:0, puts a tensor there and writes its actor
// address and the marshalled Ref to its stdout (a pipe; a file or any other
// channel works the same). The parent parses both, connects, and Gets the
// tensor onto gpu:1: across processes the owner's device arena is passed
// as a memfd over a Unix socket, so the path is p2p. It then shows the
// device guard: claiming gpu:0, which the owner holds, is refused.
//
// Devices are simulated (memfd-backed arenas); every copy is real.
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

const roleEnv = "TWOPROCESS_ROLE"

func main() {
	var err error
	if os.Getenv(roleEnv) == "owner" {
		err = owner(os.Stdin, os.Stdout)
	} else {
		err = reader(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "twoprocess:", err)
		os.Exit(1)
	}
}

// owner claims gpu:0 (TENSORLANE_DEVICES=0, set by the parent), publishes a
// tensor, and serves it until its stdin closes.
func owner(in io.Reader, out io.Writer) error {
	ctx := context.Background()
	rt, err := rdt.New(ctx, rdt.Config{DeviceMemory: 64 << 20}) // h0 of a simulated dgx-h100
	if err != nil {
		return err
	}
	defer rt.Shutdown(ctx)
	trainer, err := rt.Spawn("trainer")
	if err != nil {
		return err
	}
	gpu0, err := rt.Memory(tensor.GPUDevice(0))
	if err != nil {
		return err
	}
	w, err := tensor.Alloc(ctx, gpu0, tensor.Float32, 1024, 1024)
	if err != nil {
		return err
	}
	vals, _ := tensor.Values[float32](w)
	for i := range vals {
		vals[i] = float32(i)
	}
	ref, err := trainer.Put(ctx, w)
	if err != nil {
		return err
	}
	addr, _ := trainer.Addr().MarshalText()
	b, err := ref.MarshalBinary()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "addr %s\nref %s\n", addr, base64.StdEncoding.EncodeToString(b))
	io.Copy(io.Discard, in) // serve until the parent closes the pipe
	return nil
}

// reader starts the owner, claims gpu:1 and gets the owner's tensor.
func reader(out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.CommandContext(ctx, self, os.Args[1:]...)
	child.Env = append(os.Environ(), roleEnv+"=owner", rdt.EnvDevices+"=0")
	child.Stderr = os.Stderr
	toChild, err := child.StdinPipe()
	if err != nil {
		return err
	}
	fromChild, err := child.StdoutPipe()
	if err != nil {
		return err
	}
	if err := child.Start(); err != nil {
		return err
	}
	defer child.Wait()
	defer toChild.Close()

	var addrText, refText string
	sc := bufio.NewScanner(fromChild)
	for (addrText == "" || refText == "") && sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		switch k {
		case "addr":
			addrText = v
		case "ref":
			refText = v
		}
	}
	if refText == "" {
		return errors.New("the owner process wrote no ref")
	}
	to, err := rdt.ParseActorAddr(addrText)
	if err != nil {
		return err
	}
	b, err := base64.StdEncoding.DecodeString(refText)
	if err != nil {
		return err
	}
	ref, err := rdt.ParseRef(b)
	if err != nil {
		return err
	}

	rt, err := rdt.New(ctx, rdt.Config{VisibleDevices: []int{1}, DeviceMemory: 64 << 20})
	if err != nil {
		return err
	}
	defer rt.Shutdown(ctx)
	if err := rt.Connect(ctx, to.AddrInfo()); err != nil {
		return err
	}
	rd, _ := rt.Spawn("reader")
	got, xfer, err := rd.Fetch(ctx, ref, tensor.GPUDevice(1))
	if err != nil {
		return err
	}
	defer got.Release() // all there is to release
	vals, err := tensor.Values[float32](got)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "owner %s (pid %d) on h0 gpu:0, reader pid %d on h0 gpu:1\n", to.Name, child.Process.Pid, os.Getpid())
	fmt.Fprintf(out, "got %v over %s: v[1000]=%v\n", got, xfer.Stats.Transport, vals[1000])

	// The owner process holds gpu:0: a second claim on it is refused.
	_, err = rdt.New(ctx, rdt.Config{VisibleDevices: []int{0}, DeviceMemory: 64 << 20})
	var claimed *rdt.DeviceClaimError
	if !errors.As(err, &claimed) {
		return fmt.Errorf("claiming the owner's gpu:0: got %v, want a DeviceClaimError", err)
	}
	fmt.Fprintf(out, "claim of gpu:0 refused: held by the owner process: %v\n", claimed.PID == child.Process.Pid)
	return nil
}
