package kit_test

import (
	"context"
	"fmt"

	"github.com/tensorlane/tensorlane/fabric/internal/kit"
)

type conn struct{ id int }

func (*conn) Close() error { return nil }

// A reader's connections per owner: the second Get reuses the connection
// the first gave back, so only one is dialed.
func ExamplePool() {
	dials := 0
	pool := kit.NewPool(kit.PoolConfig[string, *conn]{
		MaxConns: 4,
		Dial: func(ctx context.Context, owner string) (*conn, error) {
			dials++
			return &conn{id: dials}, nil
		},
	})
	defer pool.Close()
	ctx := context.Background()
	c, pooled, _ := pool.Get(ctx, "owner-a")
	fmt.Println("first:", c.id, "pooled:", pooled)
	pool.Put(c) // still in step: back to the idle list
	c, pooled, _ = pool.Get(ctx, "owner-a")
	fmt.Println("second:", c.id, "pooled:", pooled)
	pool.Put(c)
	fmt.Println("dials:", dials)
	// Output:
	// first: 1 pooled: false
	// second: 1 pooled: true
	// dials: 1
}
