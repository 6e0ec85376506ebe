package rdt

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/tensor"
)

func TestActorsStopAndTopologyDevices(t *testing.T) {
	p := newPair(t, nil)
	a, err := p.a.Spawn("a")
	require.NoError(t, err)
	_, err = p.a.Spawn("b")
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, p.a.Actors())
	got, ok := p.a.Actor("a")
	assert.True(t, ok)
	assert.Same(t, a, got)

	a.Stop()
	a.Stop()
	assert.Equal(t, []string{"b"}, p.a.Actors())
	x, _ := p.b.Spawn("x")
	require.NoError(t, p.b.Connect(context.Background(), p.a.AddrInfo()))
	err = x.Send(context.Background(), a.Addr(), Message{Payload: []byte("hi")})
	assert.ErrorIs(t, err, ErrUnknownActor, "a stopped actor gets no messages")
	_, err = p.a.Spawn("a")
	require.NoError(t, err, "a stopped actor's name is free again")

	id, err := p.a.TopologyDevice(5)
	require.NoError(t, err)
	assert.Equal(t, tensor.GPUDevice(5), id)
	_, err = p.a.TopologyDevice(42)
	assert.ErrorIs(t, err, ErrUnknownDevice)
}
