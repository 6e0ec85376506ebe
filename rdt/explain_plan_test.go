package rdt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// planFrom turns each kind of planner plan into rdt's: the chosen path and
// its stripes, refusals, the fallback said aloud, a view's unbounded
// estimate, a plan refused outright. The text and JSON (what `tensorlane`,
// the C ABI and Python show) are golden: testdata/golden/explain_plans.txt,
// -update rewrites it.
func TestPlanFrom(t *testing.T) {
	h0 := fabric.Endpoint{Host: "h0", Device: tensor.GPUDevice(0)}
	h1 := fabric.Endpoint{Host: "h1", Device: tensor.GPUDevice(3)}
	refused := fabric.Plan{Src: h0, Dst: h0, Path: topology.Path{Class: topology.PathSELF}, Best: fabric.Local, Chosen: fabric.Local,
		Candidates: []fabric.Candidate{{Transport: fabric.Local, Usable: true, GBps: math.Inf(1), Reason: "same device: zero-copy view"}}}
	refused.Refuse(ErrUnknownDevice)
	var golden bytes.Buffer
	for _, c := range []struct {
		name string
		in   fabric.Plan
		want Plan // the fields the case is about
	}{
		{"rdma striped, the others refused", fabric.Plan{Src: h0, Dst: h1, Path: topology.Path{Class: topology.PathNET}, Best: fabric.RDMA, Chosen: fabric.RDMA,
			Candidates: []fabric.Candidate{
				{Transport: fabric.Local, Reason: "another runtime"},
				{Transport: fabric.SHM, Reason: "denied by configuration"},
				{Transport: fabric.RDMA, Usable: true, GBps: 50, Reason: "RDMA NICs on both hosts (400 Gb/s striped)", Stripes: 8},
				{Transport: fabric.TCP, Usable: true, GBps: 1.2, Reason: "any host over TCP", Stripes: 4},
			}},
			Plan{Chosen: fabric.RDMA, Stripes: 8}},
		{"tcp instead of rdma, said aloud", fabric.Plan{Src: h0, Dst: h1, Path: topology.Path{Class: topology.PathNET}, Best: fabric.RDMA, Chosen: fabric.TCP, Degraded: true,
			Candidates: []fabric.Candidate{
				{Transport: fabric.TCP, Usable: true, GBps: 1.2, Reason: "any host over TCP", Stripes: 4},
				{Transport: fabric.RDMA, Reason: "allowed by the topology but not running in this runtime"},
			}},
			Plan{Chosen: fabric.TCP, Stripes: 4, Degraded: true, Fallback: "allowed by the topology but not running in this runtime"}},
		{"cross-process p2p, the in-process one refused", fabric.Plan{Src: h0, Dst: fabric.Endpoint{Host: "h0", Device: tensor.GPUDevice(1)},
			Path: topology.Path{Class: topology.PathNV, Link: topology.LinkNVLink, Lanes: 18}, Best: fabric.P2P, Chosen: fabric.P2P,
			Candidates: []fabric.Candidate{
				{Transport: fabric.P2P, Via: "in-process", Reason: "the owner is another runtime"},
				{Transport: fabric.P2P, Via: "cross-process", Usable: true, GBps: 450, Reason: "device link NV18"},
			}},
			Plan{Chosen: fabric.P2P, Via: "cross-process"}},
		{"a view: unbounded, zero-copy", fabric.Plan{Src: h0, Dst: h0, Path: topology.Path{Class: topology.PathSELF}, Best: fabric.Local, Chosen: fabric.Local, ZeroCopy: true,
			Candidates: []fabric.Candidate{{Transport: fabric.Local, Usable: true, GBps: math.Inf(1), Reason: "same device: zero-copy view"}}},
			Plan{Chosen: fabric.Local, ZeroCopy: true}},
		{"refused whatever the path", refused,
			Plan{Problem: ErrUnknownDevice.Error(), Err: ErrUnknownDevice}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := planFrom(c.in)
			assert.Equal(t, c.want.Chosen, got.Chosen)
			assert.Equal(t, c.want.Via, got.Via)
			assert.Equal(t, c.want.Stripes, got.Stripes)
			assert.Equal(t, c.want.ZeroCopy, got.ZeroCopy)
			assert.Equal(t, c.want.Degraded, got.Degraded)
			assert.Equal(t, c.want.Fallback, got.Fallback)
			assert.Equal(t, c.want.Problem, got.Problem)
			assert.True(t, errors.Is(got.Err, c.want.Err) || c.want.Err == nil && got.Err == nil, "Err %v", got.Err)
			require.Len(t, got.Candidates, len(c.in.Candidates))
			js, err := json.MarshalIndent(got, "", "  ")
			require.NoError(t, err, "an unbounded estimate encodes (as 0)")
			fmt.Fprintf(&golden, "== %s\n%s\n\n%s\n", c.name, got, js)
		})
	}
	testhelp.Golden(t, "testdata/golden/explain_plans.txt", golden.Bytes())
}

// A Plan is plain data: nothing in it reaches a transport (the planner's
// plan handed out the live one). Only Err is an interface.
func TestPlanIsPlainData(t *testing.T) {
	var walk func(reflect.Type, string)
	walk = func(ty reflect.Type, path string) {
		switch ty.Kind() {
		case reflect.Struct:
			for f := range ty.Fields() {
				if ty == reflect.TypeFor[Plan]() && f.Name == "Err" {
					continue
				}
				walk(f.Type, path+"."+f.Name)
			}
		case reflect.Slice, reflect.Array, reflect.Pointer:
			walk(ty.Elem(), path+"[]")
		case reflect.Interface, reflect.Func, reflect.Chan, reflect.Map, reflect.UnsafePointer:
			t.Errorf("%s is a %s: a plan must be plain data", path, ty.Kind())
		}
	}
	walk(reflect.TypeFor[Plan](), "Plan")
}
