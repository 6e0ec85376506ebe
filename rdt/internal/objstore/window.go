package objstore

import "github.com/tensorlane/tensorlane/tensor"

// Window is a byte range of a pinned buffer, as a buffer of its own: what
// a push or a broadcast chunk hands a transport to write. Releasing it
// releases nothing (the pin's holder does).
type Window struct {
	tensor.Buffer
	Off, N int64
}

func (w *Window) Len() int64 { return w.N }
func (w *Window) Bytes() []byte {
	b, err := tensor.BytesOf(w.Buffer)
	if err != nil {
		return nil
	}
	return b[w.Off : w.Off+w.N]
}
func (w *Window) Export(a tensor.Access) (tensor.Handle, error) {
	h, err := tensor.ExportOf(w.Buffer, a)
	if err != nil {
		return h, err
	}
	h.Offset += w.Off
	h.Length = w.N
	return h, nil
}

// ChunkSums is a sealed object's checksum cache as the window sees it (a
// push of the object sends its cached sums); nil when the object has none.
func (w *Window) ChunkSums() *tensor.ChunkSums   { return tensor.SumsOf(w.Buffer).Shifted(-w.Off) }
func (w *Window) Release() error                 { return nil }
func (w *Window) Unwrap() (tensor.Buffer, int64) { return w.Buffer, w.Off }
