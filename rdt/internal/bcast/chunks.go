package bcast

import (
	"fmt"
	"sort"
)

// Chunks numbers the chunks of a broadcast's objects in one space, object
// after object, so that a batch (a state dict) flows down the tree as one
// stream: a reader's relay counts chunk numbers in a bitmap and forwards
// them by number, and Locate turns a number back into an object and a
// byte range. A reader builds it from a prepare notice, object by object,
// checking each against the bounds a notice may ask for.
type Chunks struct {
	size  int64
	items []span
	n     int
}

// span is one object's place in the numbering.
type span struct {
	total    int64
	first, n int
}

// NewChunks starts the numbering of a broadcast in chunks of size bytes.
func NewChunks(size int64) (*Chunks, error) {
	if size <= 0 {
		return nil, fmt.Errorf("%w: chunk size %d", ErrMalformed, size)
	}
	return &Chunks{size: size}, nil
}

// Add numbers the next object, of total bytes. A chunk size under MinChunk
// is refused for an object it would cut (so a forged prepare cannot make a
// reader keep a bitmap of millions of tiny chunks), as is a broadcast past
// MaxChunks in all.
func (c *Chunks) Add(total int64) error {
	if total < 0 {
		return fmt.Errorf("%w: object of %d bytes", ErrMalformed, total)
	}
	if c.size < MinChunk && total > c.size {
		return fmt.Errorf("%w: chunk size %d for %d bytes", ErrMalformed, c.size, total)
	}
	n := int((total + c.size - 1) / c.size)
	if n == 0 {
		n = 1 // an empty tensor: one empty chunk says it landed
	}
	if c.n+n > MaxChunks {
		return fmt.Errorf("%w: more than %d chunks", ErrMalformed, MaxChunks)
	}
	c.items = append(c.items, span{total: total, first: c.n, n: n})
	c.n += n
	return nil
}

// Len is the number of chunks of every object added.
func (c *Chunks) Len() int { return c.n }

// Count is the number of chunks of object k.
func (c *Chunks) Count(k int) int { return c.items[k].n }

// Locate maps chunk g to its object and the byte range in that object.
func (c *Chunks) Locate(g int) (k int, off, n int64) {
	k = sort.Search(len(c.items), func(k int) bool { return c.items[k].first+c.items[k].n > g })
	it := c.items[k]
	off = int64(g-it.first) * c.size
	return k, off, min(c.size, it.total-off)
}

// Index is the number of the chunk [off, off+n) of object k that a chunk
// or probe notice names; a range that is not exactly one of its chunks is
// malformed.
func (c *Chunks) Index(k int, off, n int64) (int, error) {
	it := c.items[k]
	i := off / c.size
	if off < 0 || off%c.size != 0 || i >= int64(it.n) || n != min(c.size, it.total-off) {
		return 0, fmt.Errorf("%w: chunk %d+%d of a %d-byte object in chunks of %d", ErrMalformed, off, n, it.total, c.size)
	}
	return it.first + int(i), nil
}
